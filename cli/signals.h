// The CLI's signal policy: temporary files never outlive a signal, and SIGPIPE is an
// error (exit 4) rather than a death. The library installs no handler of its own.
#pragma once

namespace cli {

/// For every signal whose default action ends the process (and that is not ignored
/// already, as nohup leaves SIGHUP): remove the temporary files in progress, then die of
/// the signal with its default action. Once a commit has begun the command is let finish
/// instead (its outputs are complete, or rolled back and reported); a second signal ends
/// it. SIGPIPE is ignored, so a closed pipe is a write error.
void install_signal_handlers();

}  // namespace cli
