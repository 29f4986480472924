#include "signals.h"

#include <signal.h>

#include <cerrno>

#include "ckpt/output_set.h"

namespace cli {
namespace {

// Default action "terminate" or "core", except the faults a program raises itself
// (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS), which other code may need to catch.
const int kEnding[] = {SIGINT,  SIGTERM, SIGHUP,    SIGQUIT, SIGXFSZ, SIGXCPU, SIGUSR1, SIGUSR2,
                       SIGALRM, SIGVTALRM, SIGPROF, SIGPOLL, SIGPWR,  SIGSTKFLT, SIGABRT};

void on_signal(int sig) {
  int saved = errno;
  bool die = ckpt::remove_temporaries_in_progress();
  // Either way the next one gets the default action.
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, nullptr);
  if (die) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, nullptr);
    raise(sig);
  }
  errno = saved;
}

void install(int sig) {
  struct sigaction old = {};
  if (sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) return;
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int s : kEnding) sigaddset(&sa.sa_mask, s);
  sigaction(sig, &sa, nullptr);
}

}  // namespace

void install_signal_handlers() {
  struct sigaction ign = {};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, nullptr);
  for (int s : kEnding) install(s);
  for (int s = SIGRTMIN; s <= SIGRTMAX; ++s) install(s);
}

}  // namespace cli
