// align_keys: the one place rekey --match, materialize --model and load_module decide
// whether a checkpoint's keys pair with a target's, and how a refusal is worded.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/rekey.h"

using ckpt::align_policy;
using ckpt::dtype;
using ckpt::keyed_tensor;

namespace {

std::string refusal(const std::vector<keyed_tensor>& source, const std::vector<keyed_tensor>& target,
                    const align_policy& policy) {
  try {
    ckpt::align_keys(source, target, policy, "ck.pt");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::errc::check_failed);
    return e.one_line();
  }
  return "";
}

align_policy model_policy(bool strict) {
  align_policy p;
  p.target = "the model";
  p.target_noun = "model";
  p.allow_missing = !strict;
  p.allow_unexpected = true;
  p.missing_hint = "; --no-strict fills them";
  return p;
}

}  // namespace

TEST_CASE("align_keys pairs keys through wrapper segments") {
  std::vector<keyed_tensor> source = {{"model._orig_mod.enc.weight", dtype::float32, {2, 3}},
                                      {"model._orig_mod.enc.bias", dtype::float32, {2}}};
  std::vector<keyed_tensor> target = {{"enc.weight", dtype::float32, {2, 3}}, {"enc.bias", dtype::float32, {2}}};
  align_policy exact;
  exact.target = "--match t.pt";
  ckpt::match_result m = ckpt::align_keys(source, target, exact, "ck.pt");
  CHECK(m.mapping.size() == 2);
  CHECK(m.missing.empty());
  CHECK(m.unexpected.empty());
}

TEST_CASE("align_keys refuses what its policy does not accept, in one wording") {
  std::vector<keyed_tensor> target = {{"enc.weight", dtype::float32, {2, 3}}, {"enc.bias", dtype::float32, {2}}};
  std::vector<keyed_tensor> partial = {{"module.enc.weight", dtype::float32, {2, 3}},
                                       {"module.head.weight", dtype::float32, {4}}};

  // Strict model load: the missing bias is refused, the extra head is not.
  std::string line = refusal(partial, target, model_policy(true));
  CHECK(line.find("ck.pt: cannot align the checkpoint to the model: ") == 0);
  CHECK(line.find("1 model tensors are missing from the checkpoint (enc.bias); --no-strict fills them") !=
        std::string::npos);
  CHECK(line.find("head.weight") == std::string::npos);

  // Non-strict: accepted, and the caller sees what is missing.
  ckpt::match_result m = ckpt::align_keys(partial, target, model_policy(false), "ck.pt");
  CHECK(m.missing == std::vector<std::string>{"enc.bias"});
  CHECK(m.unexpected == std::vector<std::string>{"module.head.weight"});

  // rekey --match accepts neither side unpaired and names both.
  align_policy exact;
  exact.target = "--match t.pt";
  line = refusal(partial, target, exact);
  CHECK(line.find("cannot align the checkpoint to --match t.pt: no wrapper-segment edit pairs every key") !=
        std::string::npos);
  CHECK(line.find("1 target tensors are missing from the checkpoint (enc.bias)") != std::string::npos);
  CHECK(line.find("1 checkpoint tensors have no target tensor (module.head.weight)") != std::string::npos);
}

TEST_CASE("align_keys refuses ambiguity and shape differences") {
  std::vector<keyed_tensor> target = {{"a.w", dtype::float32, {2}}};
  std::vector<keyed_tensor> twice = {{"a._orig_mod.w", dtype::float32, {2}}, {"a.w", dtype::float32, {2}}};
  CHECK(refusal(twice, target, model_policy(false)).find("ambiguous, refusing") != std::string::npos);

  std::vector<keyed_tensor> wrong_shape = {{"a.w", dtype::float32, {3}}};
  std::string line = refusal(wrong_shape, target, model_policy(false));
  CHECK(line.find("keys align but 1 shapes differ: a.w") != std::string::npos);

  // A dtype difference is not a refusal: the caller reports it.
  std::vector<keyed_tensor> other_dtype = {{"a.w", dtype::bfloat16, {2}}};
  CHECK(ckpt::align_keys(other_dtype, target, model_policy(true), "ck.pt").dtype_mismatches.size() == 1);
}
