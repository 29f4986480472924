#include "diff/value_compare.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <future>
#include <limits>

#include "diff/element_decode.h"

namespace ckpt::detail {
namespace {

// Windows at least this large read B on a second thread while A is read here.
constexpr size_t kParallelBelow = 1u << 20;

// torch.isclose computes in the inputs' dtype: float32 arithmetic for float32 and the
// narrower floats (formats.md §12.3), double for float64 and integers.
bool in_float32(dtype a, dtype b) {
  auto narrow = [](dtype t) {
    const number_kind k = number_kind_of(t);
    return (k == number_kind::real || k == number_kind::complex) && t != dtype::float64 && t != dtype::complex128;
  };
  return narrow(a) && narrow(b);
}

// torch.isclose of two elements of one integer (or bool) dtype under nonzero tolerances:
// both are cast to the default dtype, float32, first (torch/_refs isclose, "Note
// [closeness error computation]": a difference in uint8 would wrap), and every step
// rounds there, the Python-float tolerances included.
bool torch_integer_close(const exact_integer& a, const exact_integer& b, double atol, double rtol) {
  const float fa = a.negative ? -float(a.magnitude) : float(a.magnitude);
  const float fb = b.negative ? -float(b.magnitude) : float(b.magnitude);
  const float error = std::fabs(fa - fb);
  const float allowed = float(atol) + std::fabs(fb * float(rtol));
  return std::isfinite(error) && error <= allowed;
}

class judge {
 public:
  judge(const diff_options& o, dtype a, dtype b, tensor_diff& d)
      : o_(o), d_(d), ta_(a), tb_(b), float32_(in_float32(a, b)), same_type_(a == b),
        numeric_(number_kind_of(a) != number_kind::none && number_kind_of(b) != number_kind::none),
        complex_(number_kind_of(a) == number_kind::complex || number_kind_of(b) == number_kind::complex),
        integers_(number_kind_of(a) == number_kind::integer && number_kind_of(b) == number_kind::integer) {}

  bool numeric() const { return numeric_; }

  // Elements [0, count) of the two windows; `first` is the window's first element index.
  void window(const uint8_t* pa, const uint8_t* pb, uint64_t count, uint64_t first) {
    const size_t ea = element_size(ta_), eb = element_size(tb_);
    if (same_type_ && std::memcmp(pa, pb, size_t(count * ea)) == 0) return;
    for (uint64_t i = 0; i < count; ++i) {
      const uint8_t* xa = pa + i * ea;
      const uint8_t* xb = pb + i * eb;
      if (same_type_ && std::memcmp(xa, xb, ea) == 0) continue;
      if (same_type_) ++d_.bits_differ;
      if (!numeric_) {
        ++d_.not_equal;
        outside(first + i);
        continue;
      }
      if (integers_)
        integer_element(decode_integer(ta_, xa), decode_integer(tb_, xb), first + i);
      else
        element(decode_element(ta_, xa), decode_element(tb_, xb), first + i);
    }
  }

 private:
  void outside(uint64_t index) {
    if (!d_.outside++) d_.first_outside = index;
  }

  // Two integer dtypes compare as integers, as torch's == does: as doubles, int64 values
  // 2^62 and 2^62 + 1 would be one value. The errors reported are exact; whether a pair is
  // within the tolerances is torch.isclose's answer (of one dtype: torch refuses two, and
  // diff then reports the dtypes as differing).
  void integer_element(const exact_integer& a, const exact_integer& b, uint64_t index) {
    if (a == b) return;
    if (!same_type_) ++d_.bits_differ;
    ++d_.not_equal;
    const double error = integer_distance(a, b), magnitude = double(b.magnitude);
    d_.max_abs_error = std::max(d_.max_abs_error, error);
    d_.max_rel_error = std::max(d_.max_rel_error, magnitude > 0 ? error / magnitude : std::numeric_limits<double>::infinity());
    const bool close = !(o_.atol == 0 && o_.rtol == 0) && same_type_ && torch_integer_close(a, b, o_.atol, o_.rtol);
    if (!close) outside(index);
  }

  void element(element_value a, element_value b, uint64_t index) {
    if (!same_type_ && !(a.re == b.re && a.im == b.im)) ++d_.bits_differ;
    if (a.re == b.re && a.im == b.im) return;  // -0.0 and 0.0 too, as torch's == says
    const bool nan_a = std::isnan(a.re) || std::isnan(a.im), nan_b = std::isnan(b.re) || std::isnan(b.im);
    if (nan_a && nan_b && o_.equal_nan) return;
    ++d_.not_equal;
    if (nan_a || nan_b) {  // never close: isfinite(|a - b|) fails
      ++d_.nan_mismatches;
      outside(index);
      return;
    }
    // Real values skip std::complex: its abs is hypot, which made the all-elements-differ
    // path 3x slower.
    double error, allowed, magnitude;
    bool overflows = false;  // torch's own error is infinite (reported as the true one)
    if (float32_ && !complex_) {
      // As torch: the tolerances become float32 scalars, every step rounds to float32.
      const float fa = float(a.re), fb = float(b.re);
      error = std::fabs(fa - fb);
      magnitude = std::fabs(fb);
      allowed = float(o_.atol) + std::fabs(float(o_.rtol) * fb);
      // Two float16 tensors: torch's |a - b| is a float16 too, which overflows to inf (not
      // finite: never close) from 65520 up, where float32's is still finite (60000 - -60000).
      overflows = half_ && error >= kHalfOverflow;
    } else if (float32_) {
      const std::complex<float> fa(float(a.re), float(a.im)), fb(float(b.re), float(b.im));
      error = std::abs(fa - fb);
      magnitude = std::abs(fb);
      allowed = float(o_.atol) + std::abs(float(o_.rtol) * fb);
    } else if (!complex_) {
      error = std::fabs(a.re - b.re);
      magnitude = std::fabs(b.re);
      allowed = o_.atol + std::fabs(o_.rtol * b.re);
    } else {
      const std::complex<double> da(a.re, a.im), db(b.re, b.im);
      error = std::abs(da - db);
      magnitude = std::abs(db);
      allowed = o_.atol + std::abs(o_.rtol * db);
    }
    d_.max_abs_error = std::max(d_.max_abs_error, error);
    const double relative = magnitude > 0 ? error / magnitude : std::numeric_limits<double>::infinity();
    d_.max_rel_error = std::max(d_.max_rel_error, relative);
    // torch.isclose: zero tolerances ask for equality; else a finite error within the bound.
    const bool close = !(o_.atol == 0 && o_.rtol == 0) && std::isfinite(error) && !overflows && error <= allowed;
    if (!close) outside(index);
  }

  const diff_options& o_;
  tensor_diff& d_;
  dtype ta_, tb_;
  // Declared after ta_ and tb_, which it is initialized from.
  bool half_ = ta_ == dtype::float16 && tb_ == dtype::float16;
  // The least magnitude float16 rounds to infinity (round to nearest even): 65504 + half an ulp.
  static constexpr double kHalfOverflow = 65520.0;
  bool float32_, same_type_, numeric_, complex_, integers_;
};

}  // namespace

void compare_values(key_reader& a, key_reader& b, const diff_options& o, compare_buffers& buffers, tensor_diff& d,
                    const std::function<void(uint64_t)>& progress) {
  uint64_t numel = 1;
  for (int64_t n : d.shape_a) numel *= uint64_t(std::max<int64_t>(n, 0));
  d.elements = numel;
  if (!a.has_data() || !b.has_data()) {
    if (!a.has_data() && !b.has_data()) {
      d.values = value_verdict::identical;  // neither holds data: nothing can differ
      return;
    }
    d.values = value_verdict::not_compared;
    d.not_compared_reason = std::string(a.has_data() ? "B" : "A") + " holds no data for it (a meta tensor)";
    return;
  }
  judge j(o, a.type(), b.type(), d);
  if (a.type() != b.type() && !j.numeric()) {
    d.values = value_verdict::not_compared;
    d.not_compared_reason = "dtypes differ and " +
                            std::string(name(number_kind_of(a.type()) == number_kind::none ? a.type() : b.type())) +
                            " has no numeric value to compare";
    return;
  }
  const uint64_t ea = element_size(a.type()), eb = element_size(b.type());
  const uint64_t per_window = std::max<uint64_t>(1, o.window_bytes / std::max(ea, eb));
  for (uint64_t first = 0; first < numel; first += per_window) {
    const uint64_t count = std::min(per_window, numel - first);
    const size_t na = size_t(count * ea), nb = size_t(count * eb);
    if (buffers.a.size() < na) buffers.a.resize(na);
    if (buffers.b.size() < nb) buffers.b.resize(nb);
    if (nb >= kParallelBelow) {
      auto other = std::async(std::launch::async, [&] { b.read(first * eb, nb, buffers.b.data()); });
      try {
        a.read(first * ea, na, buffers.a.data());
      } catch (...) {
        other.wait();
        throw;
      }
      other.get();
    } else {
      a.read(first * ea, na, buffers.a.data());
      b.read(first * eb, nb, buffers.b.data());
    }
    j.window(buffers.a.data(), buffers.b.data(), count, first);
    if (progress) progress(na + nb);
  }
  if (d.outside)
    d.values = value_verdict::different;
  else if (d.not_equal)
    d.values = value_verdict::close;
  else if (d.bits_differ || a.type() != b.type())
    d.values = value_verdict::equal;
  else
    d.values = value_verdict::identical;
}

}  // namespace ckpt::detail
