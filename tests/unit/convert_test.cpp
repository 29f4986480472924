// plan_convert and the tensor byte source (ckpt/convert.h, src/convert/tensor_bytes.h) on an
// in-memory safetensors file: what is planned, what is refused, and that bytes held in
// memory (no file to copy from) are gathered exactly.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>

#include "ckpt/convert.h"
#include "ckpt/error.h"
#include "convert/tensor_bytes.h"

namespace {

// {"a": F32 [2] = {1.5, -2}, "b": I64 [] = 7, "__metadata__": {"format": "pt", "k": "v"}}
std::vector<uint8_t> two_tensors() {
  std::string json = R"({"__metadata__":{"format":"pt","k":"v"},)"
                     R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"I64","shape":[],"data_offsets":[8,16]}})";
  json.append((8 - json.size() % 8) % 8, ' ');
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(uint64_t(json.size()) >> (8 * i));
  out.insert(out.end(), json.begin(), json.end());
  const float a[2] = {1.5f, -2.0f};
  const int64_t b = 7;
  const auto* pa = reinterpret_cast<const uint8_t*>(a);
  const auto* pb = reinterpret_cast<const uint8_t*>(&b);
  out.insert(out.end(), pa, pa + 8);
  out.insert(out.end(), pb, pb + 8);
  return out;
}

ckpt::checkpoint open_two() {
  return ckpt::open_checkpoint(std::make_unique<ckpt::memory_source>(two_tensors(), "m.safetensors"));
}

ckpt::errc refusal(const ckpt::checkpoint& c, const ckpt::convert_request& r) {
  try {
    ckpt::plan_convert(c, r);
  } catch (const ckpt::error& e) {
    return e.kind();
  }
  FAIL("accepted");
  return ckpt::errc::corrupt;
}

}  // namespace

TEST_CASE("convert plan: keys, sizes, metadata, renames") {
  const ckpt::checkpoint c = open_two();
  ckpt::convert_request r;
  r.ops.push_back(ckpt::make_op(ckpt::key_op::add_prefix, "m."));
  const ckpt::convert_plan p = ckpt::plan_convert(c, r);
  REQUIRE(p.tensors.size() == 2);
  CHECK(p.tensors[0].name == "m.a");
  CHECK(p.tensors[0].nbytes == 8);
  CHECK(p.tensors[1].name == "m.b");
  CHECK(p.tensors[1].shape.empty());
  CHECK(p.tensors[1].nbytes == 8);
  CHECK(p.data_bytes == 16);
  CHECK(p.from_safetensors);
  CHECK(p.metadata == std::vector<std::pair<std::string, std::string>>{{"format", "pt"}, {"k", "v"}});
}

TEST_CASE("convert plan refusals") {
  const ckpt::checkpoint c = open_two();
  ckpt::convert_request select;
  select.select = {"nothing*"};
  CHECK(refusal(c, select) == ckpt::errc::usage);
  ckpt::convert_request clash;
  clash.ops.push_back(ckpt::make_rename_op("^[ab]$=x"));
  CHECK(refusal(c, clash) == ckpt::errc::check_failed);
  ckpt::convert_request no_cast;
  no_cast.cast_to = ckpt::dtype::bfloat16;  // and no function to cast with
  CHECK(refusal(c, no_cast) == ckpt::errc::usage);
  // A torch file has no place for the "k" metadata.
  ckpt::convert_request torch;
  torch.to = ckpt::convert_target::torch;
  CHECK(refusal(c, torch) == ckpt::errc::unsupported);
  torch.drop_other = true;
  CHECK(ckpt::plan_convert(c, torch).dropped == std::vector<std::string>{"__metadata__ k"});
}

TEST_CASE("bytes in memory are gathered, not copied from a file") {
  const ckpt::checkpoint c = open_two();
  const ckpt::convert_request r;
  const ckpt::convert_plan p = ckpt::plan_convert(c, r);
  const ckpt::detail::tensor_bytes source(c, p, r);
  CHECK_FALSE(source.straight_range(p.tensors[0]));
  const auto a = source.gather(p.tensors[0]);
  REQUIRE(a.nbytes == 8);
  float values[2];
  std::memcpy(values, a.bytes.get(), 8);
  CHECK(values[0] == 1.5f);
  CHECK(values[1] == -2.0f);
  const auto b = source.gather(p.tensors[1]);
  int64_t seven = 0;
  std::memcpy(&seven, b.bytes.get(), 8);
  CHECK(seven == 7);
}
