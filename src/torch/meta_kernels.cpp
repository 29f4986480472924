#include "torch/meta_kernels.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/ConvUtils.h>
#include <c10/core/WrapDimMinimal.h>
#include <torch/library.h>

namespace ckpt::detail {
namespace {

// Reached from aten::_convolution for every backend other than CPU/CUDA/MKLDNN; the
// argument checks (channels, kernel larger than input) already ran there, and the
// parameters arrive expanded to one value per spatial dimension.
at::Tensor convolution_meta(const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& /*bias*/, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                            at::IntArrayRef output_padding, int64_t groups) {
  std::vector<int64_t> out =
      transposed ? at::native::conv_input_size(input.sizes(), weight.sizes(), padding,
                                               output_padding, stride, dilation, groups)
                 : at::native::conv_output_size(input.sizes(), weight.sizes(), padding, stride,
                                                dilation);
  for (size_t d = 2; d < out.size(); ++d)
    TORCH_CHECK(out[d] > 0, "convolution: calculated output size ", c10::IntArrayRef(out),
                " is too small for input ", input.sizes());
  return at::empty(out, input.options());
}

// Like the CPU kernel: saved statistics have one value per channel when training, none
// otherwise.
std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_meta(
    const at::Tensor& input, const std::optional<at::Tensor>& /*weight*/,
    const std::optional<at::Tensor>& /*bias*/, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& /*running_var*/, bool training, double /*momentum*/,
    double /*eps*/) {
  TORCH_CHECK(input.dim() >= 2, "batch_norm: expected an input with at least 2 dimensions, got ",
              input.sizes());
  const int64_t channels = input.size(1);
  if (running_mean && running_mean->defined())
    TORCH_CHECK(running_mean->numel() == channels, "batch_norm: running_mean should contain ",
                channels, " elements not ", running_mean->numel());
  auto stats_options = input.options().dtype(
      at::isReducedFloatingType(input.scalar_type()) ? at::kFloat : input.scalar_type());
  const int64_t n = training ? channels : 0;
  return {at::empty(input.sizes(), input.options()), at::empty({n}, stats_options),
          at::empty({n}, stats_options)};
}

at::Tensor index_select_meta(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  TORCH_CHECK(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "index_select(): Expected dtype int32 or int64 for index");
  if (self.dim() == 0) {
    TORCH_CHECK(index.numel() == 1, "index_select(): Index to scalar can have only 1 value, got ",
                index.numel(), " value(s)");
    return at::empty({}, self.options());
  }
  dim = c10::maybe_wrap_dim(dim, self.dim());
  std::vector<int64_t> sizes(self.sizes().begin(), self.sizes().end());
  sizes[dim] = index.numel();
  return at::empty(sizes, self.options());
}

at::Tensor where_meta(const at::Tensor& condition, const at::Tensor& self,
                      const at::Tensor& other) {
  auto shape = at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  return at::empty(shape, self.options().dtype(at::result_type(self, other)));
}

// The math attention path (scaled_dot_product_attention) calls the out= variant directly.
at::Tensor& where_out_meta(const at::Tensor& condition, const at::Tensor& self,
                           const at::Tensor& other, at::Tensor& out) {
  auto shape = at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  out.resize_(shape);
  return out;
}

at::Tensor same_shape(const at::Tensor& self) { return at::empty(self.sizes(), self.options()); }

at::Tensor unary_meta(const at::Tensor& self) { return same_shape(self); }
at::Tensor prelu_meta(const at::Tensor& self, const at::Tensor& /*weight*/) { return same_shape(self); }
at::Tensor hardtanh_meta(const at::Tensor& self, const at::Scalar&, const at::Scalar&) {
  return same_shape(self);
}
at::Tensor logit_meta(const at::Tensor& self, std::optional<double>) { return same_shape(self); }
at::Tensor flip_meta(const at::Tensor& self, at::IntArrayRef) { return same_shape(self); }
at::Tensor roll_meta(const at::Tensor& self, at::IntArrayRef, at::IntArrayRef) {
  return same_shape(self);
}
at::Tensor channel_shuffle_meta(const at::Tensor& self, int64_t groups) {
  TORCH_CHECK(groups > 0, "Number of groups to divide channels in must be positive. Value of groups:", groups);
  return same_shape(self);
}
at::Tensor masked_softmax_meta(const at::Tensor& self, const at::Tensor&, std::optional<int64_t>,
                               std::optional<int64_t>) {
  return same_shape(self);
}
at::Tensor isnan_meta(const at::Tensor& self) {
  return at::empty(self.sizes(), self.options().dtype(at::kBool));
}

at::Tensor binary_meta(const at::Tensor& self, const at::Tensor& other) {
  return at::empty(at::infer_size(self.sizes(), other.sizes()),
                   self.options().dtype(at::result_type(self, other)));
}
at::Tensor binary_alpha_meta(const at::Tensor& self, const at::Tensor& other, const at::Scalar&) {
  return binary_meta(self, other);
}

std::tuple<at::Tensor, at::Tensor> native_dropout_meta(const at::Tensor& input, double,
                                                       std::optional<bool>) {
  return {same_shape(input), at::empty(input.sizes(), input.options().dtype(at::kBool))};
}
std::tuple<at::Tensor, at::Tensor> log_sigmoid_forward_meta(const at::Tensor& self) {
  return {same_shape(self), at::empty({0}, self.options())};
}

// Replaces the trailing spatial dimensions.
at::Tensor with_spatial(const at::Tensor& self, at::IntArrayRef spatial) {
  TORCH_CHECK(self.dim() >= int64_t(spatial.size()) + 1, "expected an input with at least ",
              spatial.size() + 1, " dimensions, got ", self.sizes());
  std::vector<int64_t> sizes(self.sizes().begin(), self.sizes().end());
  std::copy(spatial.begin(), spatial.end(), sizes.end() - spatial.size());
  return at::empty(sizes, self.options());
}
at::Tensor adaptive_avg_pool_meta(const at::Tensor& self, at::IntArrayRef output_size) {
  return with_spatial(self, output_size);
}
at::Tensor reflection_pad2d_meta(const at::Tensor& self, at::IntArrayRef padding) {
  TORCH_CHECK(padding.size() == 4, "padding size is expected to be 4");
  TORCH_CHECK(self.dim() == 3 || self.dim() == 4, "reflection_pad2d: expected 3D or 4D input, got ",
              self.sizes());
  const int64_t h = self.size(-2), w = self.size(-1);
  TORCH_CHECK(padding[0] < w && padding[1] < w && padding[2] < h && padding[3] < h,
              "Argument #4: Padding size should be less than the corresponding input dimension, "
              "but got: padding ", padding, " at dimension ", self.sizes());
  const int64_t sp[2] = {h + padding[2] + padding[3], w + padding[0] + padding[1]};
  return with_spatial(self, sp);
}
at::Tensor im2col_meta(const at::Tensor& self, at::IntArrayRef kernel, at::IntArrayRef dilation,
                       at::IntArrayRef padding, at::IntArrayRef stride) {
  TORCH_CHECK(self.dim() == 3 || self.dim() == 4, "im2col: expected 3D or 4D input, got ",
              self.sizes());
  int64_t blocks = 1;
  for (int i = 0; i < 2; ++i) {
    int64_t in = self.size(self.dim() - 2 + i);
    int64_t n = (in + 2 * padding[i] - (dilation[i] * (kernel[i] - 1) + 1)) / stride[i] + 1;
    TORCH_CHECK(n > 0, "im2col: given input with spatial size ", self.sizes(),
                ", the calculated shape of the array of sliding blocks is non-positive");
    blocks *= n;
  }
  const int64_t channels = self.size(-3) * kernel[0] * kernel[1];
  if (self.dim() == 3) return at::empty({channels, blocks}, self.options());
  return at::empty({self.size(0), channels, blocks}, self.options());
}
at::Tensor grid_sampler_2d_meta(const at::Tensor& input, const at::Tensor& grid, int64_t, int64_t,
                                bool) {
  TORCH_CHECK(input.dim() == 4 && grid.dim() == 4 && grid.size(3) == 2 &&
                  input.size(0) == grid.size(0),
              "grid_sampler_2d: expected input [N, C, H, W] and grid [N, H_out, W_out, 2], got ",
              input.sizes(), " and ", grid.sizes());
  return at::empty({input.size(0), input.size(1), grid.size(1), grid.size(2)}, input.options());
}

std::vector<int64_t> reduced_shape(const at::Tensor& t, at::OptionalIntArrayRef dims,
                                   bool keepdim) {
  std::vector<bool> reduce(size_t(t.dim()), !dims || dims->empty());
  if (dims)
    for (int64_t d : *dims) reduce[size_t(c10::maybe_wrap_dim(d, t.dim()))] = true;
  std::vector<int64_t> out;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (!reduce[size_t(d)])
      out.push_back(t.size(d));
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}
at::Tensor var_meta(const at::Tensor& self, at::OptionalIntArrayRef dim,
                    const std::optional<at::Scalar>&, bool keepdim) {
  return at::empty(reduced_shape(self, dim, keepdim),
                   self.options().dtype(c10::toRealValueType(self.scalar_type())));
}
std::tuple<at::Tensor, at::Tensor> var_mean_meta(const at::Tensor& self,
                                                 at::OptionalIntArrayRef dim,
                                                 const std::optional<at::Scalar>& correction,
                                                 bool keepdim) {
  return {var_meta(self, dim, correction, keepdim),
          at::empty(reduced_shape(self, dim, keepdim), self.options())};
}
at::Tensor prod_meta(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  at::ScalarType out = dtype ? *dtype
                             : (at::isIntegralType(self.scalar_type(), /*includeBool=*/true)
                                    ? at::kLong
                                    : self.scalar_type());
  return at::empty({}, self.options().dtype(out));
}
at::Tensor full_reduce_meta(const at::Tensor& self) {
  TORCH_CHECK(self.numel() > 0, "max(): Expected reduction dim to be specified for input.numel() == 0. "
              "Specify the reduction dim with the 'dim' argument.");
  return at::empty({}, self.options());
}
at::Tensor dot_meta(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.dim() == 1 && other.dim() == 1,
              "1D tensors expected, but got ", self.dim(), "D and ", other.dim(), "D tensors");
  TORCH_CHECK(self.numel() == other.numel(), "inconsistent tensor size, expected tensor [",
              self.numel(), "] and src [", other.numel(),
              "] to have the same number of elements, but got ", self.numel(), " and ",
              other.numel(), " elements respectively");
  return at::empty({}, self.options());
}
at::Tensor loss_shape(const at::Tensor& self, int64_t reduction) {
  return reduction == 0 ? same_shape(self) : at::empty({}, self.options());
}
at::Tensor bce_meta(const at::Tensor& self, const at::Tensor&, const std::optional<at::Tensor>&,
                    int64_t reduction) {
  return loss_shape(self, reduction);
}
at::Tensor huber_loss_meta(const at::Tensor& self, const at::Tensor&, int64_t reduction, double) {
  return loss_shape(self, reduction);
}
std::tuple<at::Tensor, at::Tensor> nll_loss2d_meta(const at::Tensor& self,
                                                   const at::Tensor& target,
                                                   const std::optional<at::Tensor>&,
                                                   int64_t reduction, int64_t) {
  TORCH_CHECK(self.dim() == 4 && target.dim() == 3 && self.size(0) == target.size(0) &&
                  self.size(2) == target.size(1) && self.size(3) == target.size(2),
              "nll_loss2d: expected input [N, C, H, W] and target [N, H, W], got ", self.sizes(),
              " and ", target.sizes());
  at::Tensor out = reduction == 0 ? at::empty(target.sizes(), self.options())
                                  : at::empty({}, self.options());
  return {out, at::empty({}, self.options())};
}
std::tuple<at::Tensor, at::Tensor> weight_norm_meta(const at::Tensor& v, const at::Tensor& g,
                                                    int64_t) {
  return {same_shape(v), at::empty(g.sizes(), g.options().dtype(
                                                  c10::toRealValueType(g.scalar_type())))};
}

thread_local int identity_equal_depth = 0;

bool equal_meta(const at::Tensor& self, const at::Tensor& other) {
  // The text LibTorch gives for a missing meta kernel, which callers already explain.
  TORCH_CHECK_NOT_IMPLEMENTED(identity_equal_depth > 0,
                              "aten::equal: attempted to run this operator with Meta tensors, but there was no "
                              "fake impl or Meta kernel registered");
  return self.is_same(other);
}

bool has_meta_kernel(const char* name, const char* overload) {
  auto op = c10::Dispatcher::singleton().findSchema(c10::OperatorName(name, overload));
  return !op || op->hasKernelForDispatchKey(c10::DispatchKey::Meta);
}

}  // namespace

void ensure_meta_kernels() {
  static std::once_flag once;
  std::call_once(once, []() {
    // Never destroyed: a registration must not be torn down while static destructors of
    // LibTorch itself may still dispatch.
    auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta,
                                   __FILE__, __LINE__);
    auto add = [&](const char* name, const char* overload, auto fn) {
      if (!has_meta_kernel((std::string("aten::") + name).c_str(), overload))
        lib->impl((*overload ? std::string(name) + "." + overload : std::string(name)).c_str(), fn);
    };
    add("convolution_overrideable", "", TORCH_FN(convolution_meta));
    add("native_batch_norm", "", TORCH_FN(batch_norm_meta));
    add("index_select", "", TORCH_FN(index_select_meta));
    add("where", "self", TORCH_FN(where_meta));
    add("where", "self_out", TORCH_FN(where_out_meta));
    add("_prelu_kernel", "", TORCH_FN(prelu_meta));
    add("relu", "", TORCH_FN(unary_meta));
    add("hardswish", "", TORCH_FN(unary_meta));
    add("hardtanh", "", TORCH_FN(hardtanh_meta));
    add("logit", "", TORCH_FN(logit_meta));
    add("flip", "", TORCH_FN(flip_meta));
    add("roll", "", TORCH_FN(roll_meta));
    add("channel_shuffle", "", TORCH_FN(channel_shuffle_meta));
    add("_masked_softmax", "", TORCH_FN(masked_softmax_meta));
    add("isnan", "", TORCH_FN(isnan_meta));
    add("floor_divide", "", TORCH_FN(binary_meta));
    add("rsub", "Tensor", TORCH_FN(binary_alpha_meta));
    add("_add_relu", "Tensor", TORCH_FN(binary_alpha_meta));
    add("native_dropout", "", TORCH_FN(native_dropout_meta));
    add("log_sigmoid_forward", "", TORCH_FN(log_sigmoid_forward_meta));
    add("_adaptive_avg_pool2d", "", TORCH_FN(adaptive_avg_pool_meta));
    add("_adaptive_avg_pool3d", "", TORCH_FN(adaptive_avg_pool_meta));
    add("reflection_pad2d", "", TORCH_FN(reflection_pad2d_meta));
    add("im2col", "", TORCH_FN(im2col_meta));
    add("grid_sampler_2d", "", TORCH_FN(grid_sampler_2d_meta));
    add("var", "correction", TORCH_FN(var_meta));
    add("std", "correction", TORCH_FN(var_meta));
    add("var_mean", "correction", TORCH_FN(var_mean_meta));
    add("std_mean", "correction", TORCH_FN(var_mean_meta));
    add("prod", "", TORCH_FN(prod_meta));
    add("max", "", TORCH_FN(full_reduce_meta));
    add("min", "", TORCH_FN(full_reduce_meta));
    add("dot", "", TORCH_FN(dot_meta));
    add("binary_cross_entropy", "", TORCH_FN(bce_meta));
    add("huber_loss", "", TORCH_FN(huber_loss_meta));
    add("nll_loss2d_forward", "", TORCH_FN(nll_loss2d_meta));
    add("_weight_norm_interface", "", TORCH_FN(weight_norm_meta));
    add("equal", "", TORCH_FN(equal_meta));
  });
}

identity_equal_scope::identity_equal_scope() {
  ensure_meta_kernels();
  ++identity_equal_depth;
}

identity_equal_scope::~identity_equal_scope() { --identity_equal_depth; }

}  // namespace ckpt::detail
