// Internal: a growable array of trivially copyable values for scratch data that reaches
// tens of MB (the one-pass .metadata decoder's memo and records).
// Large, its room is one anonymous mapping reserved at its largest size up front: address
// space only, faulted in as it is written, never moved, copied or cleared twice (a vector
// doubling to 30 MB copies and faults in about twice that). Small, it is one calloc. Room
// never written reads as zero. No MADV_HUGEPAGE: on a shared machine the kernel compacts
// memory to find huge pages at fault time, which made decoding twice as slow one run in
// three (measured on a 17 MB .metadata: 164-350 ms with it, 200-256 ms without).
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
    constexpr size_t kHuge = size_t(2) << 20;  // mappings rounded up to 2 MiB
    if (max > (SIZE_MAX - kHuge) / sizeof(T)) return;
    const size_t want = std::max<size_t>(max, 1) * sizeof(T);
    if (want < kMapped) {
      // Small (a test's few-KB pickle decoded 300,000 times): a mapping each would cost more.
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
