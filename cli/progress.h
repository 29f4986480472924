// A one-line progress bar on stderr for long transfers: drawn only when stderr is a
// terminal, at most ten times a second, safe to update from several threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace cli {

class progress_bar {
 public:
  explicit progress_bar(std::string label);
  ~progress_bar();
  void update(uint64_t done, uint64_t total);
  /// Erases the bar (the caller prints the summary).
  void finish();
  bool enabled() const { return enabled_; }

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace cli
