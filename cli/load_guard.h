// --allow-code and --load-timeout, and the timer that bounds a TorchScript load.
#pragma once

#include <CLI/CLI.hpp>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace cli {

struct code_options {
  bool allow_code = false;
  double load_timeout = 30;  // seconds
};

/// Adds --allow-code and --load-timeout to a verb that loads TorchScript through LibTorch.
void add_code_flags(CLI::App& cmd, code_options& o);

/// Bounds LibTorch's load of a TorchScript file (its compiler, constant folding, and with
/// --allow-code the file's own code) in time and in memory. LibTorch cannot be interrupted
/// and a looping interpreter thread cannot be unwound, so when a bound is passed the guard
/// writes one line and ends the process (exit 3); that is why this lives in the CLI and not
/// in the library. disarm() (or the destructor) ends the bound.
class load_guard {
 public:
  load_guard(const std::string& file, double seconds);
  ~load_guard();
  load_guard(const load_guard&) = delete;
  load_guard& operator=(const load_guard&) = delete;
  void disarm();

 private:
  void watch();
  std::string timeout_line_, memory_line_;
  double seconds_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool armed_ = true;
  std::thread thread_;
};

}  // namespace cli
