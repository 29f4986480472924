// SIGBUS from a file that shrank while it was mapped: one line and exit 4, not a crash.
#pragma once

#include <string>

namespace cli {

/// From now on a SIGBUS for a missing page of a mapping (BUS_ADRERR: the file under it was
/// truncated) ends the process with "ckptool: io: FILE: changed size while mapped", exit 4.
/// Other SIGBUS causes keep the default action.
void exit_on_sigbus(const std::string& file);

}  // namespace cli
