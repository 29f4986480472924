// ckpt::aoti::parse_wrapper: the constants table, inputs and call spec of a generated
// wrapper.cpp (docs/formats.md §15.3-15.4), and the refusals of text that breaks the
// shapes Inductor writes; ckpt::aoti::plan_swap's refusals.
#include <doctest/doctest.h>

#include <string>

#include "ckpt/aoti.h"
#include "ckpt/error.h"

using ckpt::errc;
namespace aoti = ckpt::aoti;

namespace {

// The lines Inductor 2.11 writes for Linear(8,16) + Linear(16,4) with a dynamic batch
// (trimmed to what the reader looks at).
const std::string kWrapper = R"W(
AOTInductorModel::AOTInductorModel(std::shared_ptr<ConstantMap> constants_map,
                                   std::optional<std::string> cubin_dir)
    : AOTInductorModelBase(1,
                           1,
                           2,
                           device_str,
                           std::move(cubin_dir),
                           true) {
    inputs_info_[0].name = "arg5_1";
    constants_info_[0].name = "fc1_weight";
    constants_info_[0].dtype = cached_torch_dtype_float32;
    constants_info_[0].device_type = cached_torch_device_type_cpu;
    constants_info_[0].offset = 0;
    constants_info_[0].data_size = 512;
    constants_info_[0].from_folded = false;
    constants_info_[0].type = static_cast<int32_t>(torch::aot_inductor::ConstantType::Parameter);
    constants_info_[0].shape = {16, 8};
    constants_info_[0].stride = {8, 1};
    constants_info_[0].layout = static_cast<int32_t>(cached_torch_layout_strided);
    constants_info_[0].original_fqn = "fc1.weight";
    constants_info_[1].name = "shift";
    constants_info_[1].dtype = cached_torch_dtype_bfloat16;
    constants_info_[1].data_size = 64;
    constants_info_[1].type = static_cast<int32_t>(torch::aot_inductor::ConstantType::Buffer);
    constants_info_[1].shape = {};
    constants_info_[1].stride = {};
    constants_info_[1].original_fqn = "shift";
    in_spec_ = R"([1, {"type": null}])";
    out_spec_ = R"([1, {"type": null}])";
    outputs_info_[0].name = "output0";
}
AOTI_NOINLINE static void check_input_0(
    int32_t arg5_1_expected_dtype = aoti_torch_dtype_float32();
    if (arg5_1_size[0] < 2) {
    if (arg5_1_size[0] > 1024) {
    if (8 != arg5_1_size[1]) {
    if (8 != arg5_1_stride[0]) {
    int32_t arg5_1_expected_device_type = 0;
}
static bool _check_aoti_runtime_check_inputs_env() {
void AOTInductorModel::run_impl(
    int64_t s77 = arg5_1_size[0];
)W";

aoti::model parse(const std::string& text) {
  aoti::model m;
  aoti::parse_wrapper(text, m, 1000);
  return m;
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

void refused(const std::string& text, errc kind, const std::string& words) {
  try {
    parse(text);
    FAIL("accepted");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == kind);
    CHECK_MESSAGE(e.message().find(words) != std::string::npos, e.message());
    CHECK(e.offset().has_value());
    CHECK(*e.offset() >= 1000);
  }
}

}  // namespace

TEST_CASE("aoti wrapper: the table, inputs and spec Inductor writes") {
  aoti::model m = parse(kWrapper);
  CHECK(m.num_inputs == 1);
  CHECK(m.num_outputs == 1);
  CHECK(m.include_weights);
  REQUIRE(m.constants.size() == 2);
  CHECK(m.constants[0].original_fqn == "fc1.weight");
  CHECK(m.constants[0].type == ckpt::dtype::float32);
  CHECK(m.constants[0].shape == std::vector<int64_t>{16, 8});
  CHECK(m.constants[0].data_size == 512);
  CHECK(m.constants[0].kind == aoti::constant_kind::parameter);
  CHECK(m.constants[1].type == ckpt::dtype::bfloat16);
  CHECK(m.constants[1].shape.empty());
  CHECK(m.constants[1].kind == aoti::constant_kind::buffer);
  REQUIRE(m.inputs.size() == 1);
  CHECK(m.inputs[0].name == "arg5_1");
  CHECK(m.inputs[0].dtype_text == "float32");
  CHECK(m.inputs[0].device == "cpu");
  REQUIRE(m.inputs[0].dims.size() == 2);
  CHECK(m.inputs[0].dims[0].min == 2);
  CHECK(m.inputs[0].dims[0].max == 1024);
  CHECK(m.inputs[0].dims[0].symbol == "s77");
  CHECK(m.inputs[0].dims[1].size == 8);
  CHECK(m.output_names == std::vector<std::string>{"output0"});
  CHECK(m.in_spec == R"([1, {"type": null}])");
}

TEST_CASE("aoti wrapper: hostile text is refused with its line's offset") {
  refused(replaced(kWrapper, "constants_info_[1].name", "constants_info_[7].name"), errc::corrupt, "out of range");
  refused(replaced(kWrapper, "constants_info_[1].name", "constants_info_[18446744073709551617].name"), errc::corrupt,
          "integer");
  refused(replaced(kWrapper, "{16, 8}", "{" + std::string(200, '1') + "}"), errc::corrupt, "integer");
  std::string many = "{1";
  for (int i = 0; i < 70; ++i) many += ", 1";
  refused(replaced(kWrapper, "{16, 8}", many + "}"), errc::limit, "dimensions");
  refused(replaced(kWrapper, "\"fc1_weight\";", "\"fc1_weight;"), errc::corrupt, "string literal");
  refused(replaced(kWrapper, "\"fc1_weight\";", "\"fc1\\x41\";"), errc::unsupported, "escape");
  refused(replaced(kWrapper, "data_size = 512", "data_size = -512"), errc::corrupt, "negative");
  refused(replaced(kWrapper, "ConstantType::Parameter", "ConstantType::Bogus"), errc::unsupported, "Bogus");
  refused(replaced(kWrapper, "cached_torch_dtype_float32;", "7;"), errc::corrupt, "dtype");
  refused(replaced(kWrapper, "                           2,", "                           4294967296,"), errc::limit,
          "constants");
  refused(replaced(kWrapper, "check_input_0(", "check_input_3("), errc::corrupt, "for no input");
  refused(replaced(kWrapper, "    constants_info_[0].shape = {16, 8};\n",
                   "    constants_info_[0].shape = {16, 8};\n    constants_info_[0].shape = {16, 8};\n"),
          errc::corrupt, "twice");
  refused(replaced(kWrapper, "in_spec_ = R\"([1, {\"type\": null}])\";", "in_spec_ = R\"([1,"), errc::corrupt,
          "raw string");
}

TEST_CASE("aoti wrapper: tables that contradict themselves") {
  auto kind_of = [](const std::string& text) {
    try {
      parse(text);
    } catch (const ckpt::error& e) {
      return e.kind();
    }
    return errc::check_failed;
  };
  CHECK(kind_of(replaced(kWrapper, "AOTInductorModelBase(", "Other(")) == errc::corrupt);
  CHECK(kind_of(replaced(kWrapper, "    constants_info_[1].shape = {};\n", "")) == errc::corrupt);
  CHECK(kind_of(replaced(kWrapper, "stride = {8, 1}", "stride = {1}")) == errc::corrupt);
  CHECK(kind_of(replaced(kWrapper, "\"shift\";\n    constants_info_[1].dtype", "\"fc1_weight\";\n    constants_info_[1].dtype")) ==
        errc::corrupt);
  CHECK(kind_of(std::string(1 << 16, '\n')) == errc::corrupt);
  CHECK(kind_of("") == errc::corrupt);
}
