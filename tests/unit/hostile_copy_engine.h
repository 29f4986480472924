// A copy engine that keeps the letter of copy_engine's contract and nothing more, so the
// staging pipeline is proven against the worst a real engine (CUDA streams and events)
// may do:
//  - copies run late, on a thread of the engine's own, in a random order, and only once
//    more than `hold` submissions are pending or somebody waits (then still at random);
//  - a copy reads its source when it runs, not when it was submitted, and overwrites the
//    source with poison right after: a pipeline that refills a staging buffer too early,
//    or reads from it after handing it over, delivers wrong bytes;
//  - submission number `fail_at` (0-based) fails: wait() throws, its bytes never land.
// Header-only: used by tests/unit/staging_pipeline_test.cpp and tests/tools/staged_load.cpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/error.h"
#include "io/copy_engine.h"

namespace ckpt::testing {

class hostile_copy_engine final : public detail::copy_engine {
 public:
  struct options {
    uint32_t seed = 1;
    int max_delay_us = 100;  // each copy waits up to this long before it runs
    size_t hold = 1;         // pending submissions kept back unless waited for
    std::optional<uint64_t> fail_at;
    uint8_t poison = 0xA5;
  };

  explicit hostile_copy_engine(options o) : o_(o), random_(o.seed), worker_([this] { run(); }) {}
  ~hostile_copy_engine() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  ticket submit(const detail::copy_request* copies, size_t count) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const ticket t = next_++;
    job& j = jobs_[t];
    j.copies.assign(copies, copies + count);
    j.fails = o_.fail_at && *o_.fail_at == t;
    pending_.push_back(t);
    ++submitted_;
    cv_.notify_all();
    return t;
  }

  bool poll(ticket t) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return jobs_.at(t).done;
  }

  void wait(ticket t) override {
    std::unique_lock<std::mutex> lock(mutex_);
    job& j = jobs_.at(t);
    j.wanted = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return j.done; });
    const bool failed = j.fails;
    jobs_.erase(t);
    ++waited_;
    if (failed) throw error(errc::device, "injected copy failure (submission " + std::to_string(t) + ")");
  }

  uint64_t submitted() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return submitted_;
  }
  /// Tickets submitted but not yet waited for: a pipeline must leave none.
  size_t outstanding() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return jobs_.size();
  }
  uint64_t waited() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return waited_;
  }

 private:
  struct job {
    std::vector<detail::copy_request> copies;
    bool fails = false;
    bool wanted = false;
    bool done = false;
  };

  bool may_complete() const {
    if (pending_.size() > o_.hold) return true;
    for (ticket t : pending_)
      if (jobs_.at(t).wanted) return true;
    return false;
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (!pending_.empty() && may_complete()); });
      if (stop_) return;
      // Any pending submission, not the oldest and not necessarily the one waited for.
      const size_t pick = std::uniform_int_distribution<size_t>(0, pending_.size() - 1)(random_);
      const ticket t = pending_[pick];
      pending_.erase(pending_.begin() + long(pick));
      const int delay = std::uniform_int_distribution<int>(0, o_.max_delay_us)(random_);
      std::vector<detail::copy_request> copies = jobs_.at(t).copies;
      const bool fails = jobs_.at(t).fails;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(delay));
      if (!fails) {
        for (const auto& c : copies) {
          for (uint64_t row = 0; row < std::max<uint64_t>(c.rows, 1); ++row)
            std::memcpy(c.dst + row * c.dst_pitch, c.src + row * c.nbytes, size_t(c.nbytes));
          std::memset(const_cast<uint8_t*>(c.src), o_.poison, size_t(c.nbytes * std::max<uint64_t>(c.rows, 1)));
        }
      }
      lock.lock();
      jobs_.at(t).done = true;
      cv_.notify_all();
    }
  }

  options o_;
  std::mt19937 random_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<ticket, job> jobs_;
  std::vector<ticket> pending_;
  ticket next_ = 0;
  uint64_t submitted_ = 0, waited_ = 0;
  bool stop_ = false;
  std::thread worker_;  // last: started once everything above exists
};

}  // namespace ckpt::testing
