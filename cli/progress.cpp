#include "progress.h"

#include <cstdio>

#include "common.h"

namespace cli {

progress_bar::progress_bar(std::string label)
    : label_(std::move(label)), enabled_(stderr_is_terminal()), start_(std::chrono::steady_clock::now()) {}

progress_bar::~progress_bar() { finish(); }

void progress_bar::update(uint64_t done, uint64_t total) {
  if (!enabled_ || total == 0) return;
  auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  double seconds = std::chrono::duration<double>(now - start_).count();
  double rate = seconds > 0 ? double(done) / seconds : 0;
  const int width = 30;
  int filled = int(double(width) * double(done) / double(total));
  std::string bar(size_t(filled), '#');
  bar.resize(size_t(width), ' ');
  std::fprintf(stderr, "\r%s [%s] %3d%%  %s / %s  %s/s ", label_.c_str(), bar.c_str(), int(100.0 * double(done) / double(total)),
               human_bytes(done).c_str(), human_bytes(total).c_str(), human_bytes(uint64_t(rate)).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void progress_bar::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }
}

}  // namespace cli
