#include "io/staging_pipeline.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>

#include "ckpt/error.h"

namespace ckpt::detail {
namespace {

struct slot_state {
  bool busy = false;     // a thread is waiting for it, or reading into it
  bool pending = false;  // copies out of it were submitted and not yet waited for
  copy_engine::ticket ticket = 0;
  uint64_t sequence = 0;  // submission order, to wait for the oldest when none is done
  size_t read = 0;        // the read whose copies are pending
};

// A ticket taken out of a slot, now owed a wait by whoever holds it.
struct owed_wait {
  bool owed = false;
  copy_engine::ticket ticket = 0;
  size_t read = 0;
};

template <slot_reuse reuse>
class pipeline {
 public:
  pipeline(const read_plan& plan, const std::vector<const byte_source*>& files,
           const std::vector<uint8_t*>& destinations, const staging_ring& ring, copy_engine& engine,
           const staging_options& options)
      : plan_(plan), files_(files), dst_(destinations), ring_(ring), engine_(engine), o_(options),
        slots_(ring.slots) {}

  void run() {
    check_plan();
    if (plan_.reads.empty()) return;
    const size_t threads = std::clamp<size_t>(size_t(std::max(o_.threads, 1)), 1,
                                              std::min(ring_.slots, plan_.reads.size()));
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t) {
      try {
        pool.emplace_back([this] { work(); });
      } catch (const std::system_error&) {  // no more threads to be had: fewer share the work
        break;
      }
    }
    work();
    for (auto& t : pool) t.join();
    drain();
    if (failure_) std::rethrow_exception(failure_);
    if (cancelled()) throw error(errc::io, "interrupted").with_file(files_.front()->name());
  }

 private:
  // A plan this ring cannot carry is a bug of the caller, not a property of the input.
  void check_plan() const {
    if (ring_.slots == 0 || !ring_.memory) throw std::logic_error("staging pipeline: no staging buffers");
    for (const read_op& op : plan_.reads) {
      if (op.nbytes > ring_.slot_bytes) throw std::logic_error("staging pipeline: a read is longer than a buffer");
      if (op.file >= files_.size() || !files_[op.file]) throw std::logic_error("staging pipeline: no such file");
      for (size_t p = op.first_piece; p < op.first_piece + op.piece_count; ++p)
        if (plan_.pieces.at(p).storage >= dst_.size() || !dst_[plan_.pieces[p].storage])
          throw std::logic_error("staging pipeline: a piece has no destination");
    }
  }

  bool cancelled() const { return o_.cancel && o_.cancel->load(std::memory_order_relaxed); }
  bool stopping() const { return failed_.load(std::memory_order_relaxed) || cancelled(); }

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_) failure_ = e;
    failed_ = true;
  }

  void work() {
    for (;;) {
      if (stopping()) return;
      const size_t j = next_.fetch_add(1);
      if (j >= plan_.reads.size()) return;
      owed_wait owed;
      const size_t k = acquire(owed);
      try {
        settle(owed);
        if (stopping()) {
          release(k);
          return;
        }
        fill_and_submit(k, j);
      } catch (...) {
        fail(std::current_exception());
        release(k);
        return;
      }
    }
  }

  // Blocks until a slot is free and takes it, with the wait its last copies are owed.
  size_t acquire(owed_wait& owed) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return std::any_of(slots_.begin(), slots_.end(), [](const slot_state& s) { return !s.busy; }); });
    size_t best = slots_.size();
    for (size_t k = 0; k < slots_.size(); ++k) {
      const slot_state& s = slots_[k];
      if (s.busy) continue;
      if (!s.pending) {  // never used, or already waited for
        best = k;
        break;
      }
      if (best == slots_.size() || s.sequence < slots_[best].sequence) best = k;
    }
    // Completion order is the engine's: a buffer whose copies are already done beats the
    // oldest one, which may well be the last to finish.
    if (slots_[best].pending && !engine_.poll(slots_[best].ticket))
      for (size_t k = 0; k < slots_.size(); ++k)
        if (!slots_[k].busy && slots_[k].pending && engine_.poll(slots_[k].ticket)) {
          best = k;
          break;
        }
    slot_state& s = slots_[best];
    s.busy = true;
    if (s.pending) {
      owed = {true, s.ticket, s.read};
      s.pending = false;
      if (reuse == slot_reuse::too_early) {
        // The broken variant: the wait is put off to the end, so the buffer is refilled
        // while its copies may still be reading it.
        late_.push_back(owed);
        owed.owed = false;
      }
    }
    return best;
  }

  void release(size_t k) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slots_[k].busy = false;
    }
    cv_.notify_one();
  }

  // Waits for copies owed a wait, and counts their bytes as landed.
  void settle(const owed_wait& owed) {
    if (!owed.owed) return;
    const read_op& op = plan_.reads[owed.read];
    try {
      engine_.wait(owed.ticket);
    } catch (const error& e) {
      // In the file's coordinates, which differ from the source's for a slice.
      const byte_source& file = *files_[op.file];
      const uint64_t at = file.origin_offset() + op.offset;
      error failed(e.kind(),
                   "copying file bytes [" + std::to_string(at) + ", " + std::to_string(at + op.nbytes) +
                       ") to their destination failed: " + e.message(),
                   op.offset);
      throw file.locate(failed);
    }
    uint64_t bytes = 0;
    for (size_t p = op.first_piece; p < op.first_piece + op.piece_count; ++p) bytes += plan_.pieces[p].nbytes;
    const uint64_t now = landed_ += bytes;
    if (o_.progress) o_.progress(now, plan_.storage_bytes);
  }

  void fill_and_submit(size_t k, size_t j) {
    const read_op& op = plan_.reads[j];
    uint8_t* buffer = ring_.memory + k * ring_.slot_bytes;
    files_[op.file]->read_exact(op.offset, buffer, size_t(op.nbytes));
    std::vector<copy_request> copies;
    copies.reserve(op.piece_count);
    for (size_t p = op.first_piece; p < op.first_piece + op.piece_count; ++p) {
      const read_piece& piece = plan_.pieces[p];
      const box_landing* box = o_.boxes && piece.storage < o_.boxes->size() ? (*o_.boxes)[piece.storage] : nullptr;
      if (!box) {
        copies.push_back({buffer + piece.read_offset, dst_[piece.storage] + piece.storage_offset, piece.nbytes});
        continue;
      }
      // Straight out of the staging buffer into the strided view: no bounce of its own.
      const uint8_t* src = buffer + piece.read_offset;
      for_each_span(*box, piece.storage_offset, piece.nbytes, [&](const box_span& s) {
        copies.push_back({src + (s.piece_offset - piece.storage_offset), dst_[piece.storage] + s.dst_offset, s.width,
                          s.rows, s.pitch});
      });
    }
    const copy_engine::ticket t = engine_.submit(copies.data(), copies.size());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slot_state& s = slots_[k];
      s.pending = true;
      s.ticket = t;
      s.read = j;
      s.sequence = sequence_++;
      s.busy = false;
    }
    cv_.notify_one();
  }

  // Every ticket still owed a wait gets it, whatever happened: nothing may still be
  // copying once the caller gets control back.
  void drain() {
    std::vector<owed_wait> owed = std::move(late_);
    for (slot_state& s : slots_)
      if (s.pending) owed.push_back({true, s.ticket, s.read});
    for (const owed_wait& w : owed) {
      try {
        settle(w);
      } catch (...) {
        fail(std::current_exception());
      }
    }
  }

  const read_plan& plan_;
  const std::vector<const byte_source*>& files_;
  const std::vector<uint8_t*>& dst_;
  const staging_ring& ring_;
  copy_engine& engine_;
  const staging_options& o_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<slot_state> slots_;
  std::vector<owed_wait> late_;  // slot_reuse::too_early only
  uint64_t sequence_ = 0;
  std::atomic<size_t> next_{0};
  std::atomic<uint64_t> landed_{0};
  std::atomic<bool> failed_{false};
  std::exception_ptr failure_;
};

}  // namespace

template <slot_reuse reuse>
void run_staging_pipeline(const read_plan& plan, const std::vector<const byte_source*>& files,
                          const std::vector<uint8_t*>& destinations, const staging_ring& ring, copy_engine& engine,
                          const staging_options& options) {
  pipeline<reuse>(plan, files, destinations, ring, engine, options).run();
}

template void run_staging_pipeline<slot_reuse::after_copy>(const read_plan&, const std::vector<const byte_source*>&,
                                                           const std::vector<uint8_t*>&, const staging_ring&,
                                                           copy_engine&, const staging_options&);
template void run_staging_pipeline<slot_reuse::too_early>(const read_plan&, const std::vector<const byte_source*>&,
                                                          const std::vector<uint8_t*>&, const staging_ring&,
                                                          copy_engine&, const staging_options&);

}  // namespace ckpt::detail
