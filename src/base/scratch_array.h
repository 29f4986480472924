// Internal: a growable array of trivially copyable values for scratch data that reaches
// tens of MB (the one-pass .metadata decoder's memo and records). Its room is one anonymous
// mapping reserved at its largest size up front (address space only, never moved or
// copied) and, when that room is large, marked for transparent huge pages: a 4-KiB page
// fault per 4 KiB touched was a third of the decoder's time on a 17 MB .metadata. Where the
// kernel gives no huge pages it is an ordinary mapping, faulted in as it is written. Room
// never written reads as zero.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace ckpt::detail {

template <class T>
class scratch_array {
  static_assert(std::is_trivially_copyable_v<T>, "scratch_array holds plain values");

 public:
  /// Room for at most `max` elements; ok() is false when the mapping failed.
  explicit scratch_array(size_t max) {
    constexpr size_t kHuge = size_t(2) << 20;
    if (max > (SIZE_MAX - kHuge) / sizeof(T)) return;
    const size_t want = std::max<size_t>(max, 1) * sizeof(T);
    if (want < kMapped) {
      // Small: a huge page cleared for a few KB would cost more than it saves.
      data_ = static_cast<T*>(std::calloc(want, 1));
      cap_ = data_ ? max : 0;
      return;
    }
    bytes_ = (want + kHuge - 1) / kHuge * kHuge;
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      bytes_ = 0;
      return;
    }
#ifdef MADV_HUGEPAGE
    ::madvise(p, bytes_, MADV_HUGEPAGE);
#endif
    data_ = static_cast<T*>(p);
    cap_ = bytes_ / sizeof(T);
  }
  scratch_array(const scratch_array&) = delete;
  scratch_array& operator=(const scratch_array&) = delete;
  ~scratch_array() {
    if (data_ && bytes_) ::munmap(data_, bytes_);
    else std::free(data_);
  }

  bool ok() const { return data_ != nullptr; }
  size_t size() const { return size_; }
  size_t capacity() const { return cap_; }
  bool empty() const { return size_ == 0; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T& back() { return data_[size_ - 1]; }
  const T& back() const { return data_[size_ - 1]; }

  // The caller keeps within capacity() (these do not check).
  void push_back(const T& v) { data_[size_++] = v; }
  void append(const T* first, size_t n) {
    if (n) std::memcpy(static_cast<void*>(data_ + size_), first, n * sizeof(T));
    size_ += n;
  }
  void pop_back() { --size_; }
  void resize(size_t n) { size_ = n; }  // shrinking, or growing over zeroed (never written) room
  /// Grows to `n` elements, the new ones set to `fill`.
  void grow_to(size_t n, const T& fill) {
    for (size_t i = size_; i < n; ++i) data_[i] = fill;
    size_ = n;
  }

 private:
  static constexpr size_t kMapped = size_t(16) << 20;  // bytes of room from which it maps
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t cap_ = 0;
  size_t bytes_ = 0;
};

}  // namespace ckpt::detail
