#include "sigbus.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "ckpt/error.h"
#include "ckpt/output_set.h"

// Why a handler rather than never touching mapped pages after validation: --mmap hands out
// tensors backed by the file's pages, and everything after the load reads them (--check-
// finite, --dtype's cast, -o, --run, LibTorch's own kernels); reading them all through
// pread would be the copy that --mmap exists to avoid, and the CPU loader maps the file as
// well. The kernel reports a page past the end of a shrunk file as SIGBUS/BUS_ADRERR in
// whichever thread touches it; the library installs no handlers (an embedding service owns
// its signals), so the CLI does. The line is formatted before the handler can run: the
// handler only calls write(2) and _exit(2), both async-signal-safe. No output exists yet
// when the mapped pages are read for the load, but -o reads them again while it writes: the
// temporary files in progress are removed first (remove_temporaries_in_progress is
// async-signal-safe), as the CLI's other fatal-signal handlers do.
namespace cli {
namespace {

char g_line[4096];
size_t g_length = 0;
// Several threads (a parallel scan) can fault on the vanished pages at once: one reports,
// the others wait for its _exit. std::atomic_flag is lock-free, so signal-safe.
std::atomic_flag g_reporting = ATOMIC_FLAG_INIT;

void on_sigbus(int, siginfo_t* info, void*) {
  if (info && info->si_code == BUS_ADRERR) {
    if (g_reporting.test_and_set())
      for (;;) ::pause();
    ckpt::remove_temporaries_in_progress();
    ssize_t ignored = ::write(STDERR_FILENO, g_line, g_length);
    (void)ignored;
    ::_exit(ckpt::exit_code(ckpt::errc::io));
  }
  // Not a vanished page: return to the default action, which the faulting instruction
  // meets again when it is retried.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGBUS, &dfl, nullptr);
}

}  // namespace

void exit_on_sigbus(const std::string& file) {
  static const char kPrefix[] = "ckptool: io: ";
  static const char kSuffix[] = ": changed size while mapped (truncated while ckptool was reading it)\n";
  std::string name = file.substr(0, sizeof g_line - sizeof kPrefix - sizeof kSuffix);
  for (char& c : name)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  std::string line = kPrefix + name + kSuffix;
  std::memcpy(g_line, line.data(), line.size());
  g_length = line.size();
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, nullptr);
}

}  // namespace cli
