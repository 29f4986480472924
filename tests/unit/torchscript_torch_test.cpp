// TorchScript on meta (src/torch/torchscript.cpp) with modules built and saved in C++, read
// back from memory so the byte counts are exact. tests/py/test_torchscript.py compares
// against modules scripted by real PyTorch.
#include <sstream>
#include <string>
#include <vector>

#include <torch/script.h>
#include <torch/serialize.h>

#include "torch_doctest.h"

#include "ckpt/byte_source.h"
#include "ckpt/error.h"
#include "ckpt/torchscript.h"
#include "torch/torchscript_module.h"
#include "ckpt/zip_reader.h"

namespace {

constexpr int64_t kDim = 256;  // w: 256 x 256 float32 = 256 KiB of tensor data

std::vector<uint8_t> saved_module() {
  torch::jit::Module m("Toy");
  m.register_parameter("w", torch::ones({kDim, kDim}), /*requires_grad=*/false);
  m.register_buffer("steps", torch::zeros({kDim}, torch::kLong));
  m.register_attribute("k", c10::IntType::get(), int64_t(5));
  m.register_attribute("tag", c10::StringType::get(), std::string("toy"));
  torch::jit::Module child("Child");
  child.register_parameter("scale", torch::full({kDim}, 2.0), false);
  child.define(R"(
def forward(self, x):
    return x * self.scale
)");
  m.register_module("child", child);
  m.define(R"(
def forward(self, x):
    return self.child.forward(torch.matmul(x, self.w) + self.steps)

def evaluation_step(self, x, n: int):
    y = self.forward(x)
    return y.sum(dim=1), [y, x], n + self.k
)");
  std::ostringstream os;
  m.save(os);
  const std::string s = os.str();
  return std::vector<uint8_t>(s.begin(), s.end());
}

struct fixture {
  ckpt::memory_source src{saved_module(), "toy.pt"};
  std::unique_ptr<ckpt::zip::archive> ar = ckpt::zip::archive::open(src);
};

}  // namespace

TEST_CASE("inspect_torchscript describes the module without reading tensor data") {
  fixture f;
  const uint64_t after_open = f.src.bytes_read();
  ckpt::torchscript_info info = ckpt::inspect_torchscript("toy.pt", *f.ar);
  const uint64_t read = f.src.bytes_read() - after_open;

  CHECK(info.type == "__torch__.Toy");
  REQUIRE(info.parameters.size() == 2);
  CHECK(info.parameters[0].name == "w");
  CHECK(info.parameters[0].dtype == "float32");
  CHECK(info.parameters[0].shape == std::vector<int64_t>{kDim, kDim});
  CHECK(info.parameters[1].name == "child.scale");
  REQUIRE(info.buffers.size() == 1);
  CHECK(info.buffers[0].name == "steps");
  CHECK(info.buffers[0].dtype == "int64");
  REQUIRE(info.submodules.size() == 1);
  CHECK(info.submodules[0].name == "child");
  CHECK(info.submodules[0].type == "__torch__.Child");

  bool saw_forward = false, saw_eval = false;
  for (const auto& m : info.methods) {
    if (m.name == "forward") {
      saw_forward = true;
      CHECK(m.schema == "forward(__torch__.Toy self, Tensor x) -> Tensor");
    }
    if (m.name == "evaluation_step") {
      saw_eval = true;
      CHECK(m.schema.find("int n") != std::string::npos);
    }
  }
  CHECK(saw_forward);
  CHECK(saw_eval);

  bool saw_k = false, saw_tag = false;
  for (const auto& a : info.attributes) {
    if (a.name == "k") saw_k = (a.type == "int" && a.value == "5");
    if (a.name == "tag") saw_tag = (a.type == "str" && a.value == "'toy'");
    CHECK(a.name != "w");
    CHECK(a.name != "training");
  }
  CHECK(saw_k);
  CHECK(saw_tag);

  // The storages (w, steps, child.scale) are ~260 KiB; only metadata and code are read.
  const uint64_t tensor_bytes = (kDim * kDim + kDim) * 4 + kDim * 8;
  CHECK(info.bytes_skipped == tensor_bytes);
  // LibTorch's reads, plus ckptool's own passes before it: data.pkl for unsafe globals,
  // the code/ sources for code that runs on load.
  uint64_t code_bytes = 0;
  for (const auto& e : f.ar->entries())
    if (e.record.rfind("code/", 0) == 0 && e.record.find(".debug_pkl") == std::string::npos)
      code_bytes += e.compressed_size;
  CHECK(read == info.bytes_read + f.ar->find("data.pkl")->uncompressed_size + code_bytes);
  CHECK(read < tensor_bytes / 10);
}

TEST_CASE("load_on_meta puts every tensor on meta") {
  fixture f;
  ckpt::meta_load_stats stats;
  torch::jit::Module m = ckpt::load_on_meta("toy.pt", *f.ar, &stats);
  for (const auto& p : m.named_parameters()) CHECK(p.value.is_meta());
  for (const auto& b : m.named_buffers()) CHECK(b.value.is_meta());
  CHECK(stats.bytes_skipped > 0);
}

TEST_CASE("run_on_meta reports output shapes") {
  fixture f;
  auto out = ckpt::run_on_meta("toy.pt", *f.ar, "forward", {{{3, kDim}, ckpt::dtype::float32}});
  REQUIRE(out.size() == 1);
  CHECK(out[0].path == "");
  CHECK(out[0].is_tensor);
  CHECK(out[0].dtype == "float32");
  CHECK(out[0].shape == std::vector<int64_t>{3, kDim});

  // evaluation_step takes a tensor and an int: without the int it is a usage error naming
  // it; with it (positional or by name) it runs; forward with the wrong width is a usage
  // error too.
  try {
    ckpt::run_on_meta("toy.pt", *f.ar, "evaluation_step", {{{3, kDim}, ckpt::dtype::float32}});
    FAIL("expected an error");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::errc::usage);
    CHECK(e.message().find("missing argument 'n' (int)") != std::string::npos);
  }
  for (const ckpt::arg_spec& a : {ckpt::arg_spec{"", "4"}, ckpt::arg_spec{"n", "4"}}) {
    auto ev = ckpt::run_on_meta("toy.pt", *f.ar, "evaluation_step", {{{3, kDim}, ckpt::dtype::float32}}, false, {a});
    REQUIRE(ev.size() == 4);
    CHECK(ev[3].type == "int");
  }
  try {
    ckpt::run_on_meta("toy.pt", *f.ar, "evaluation_step", {{{3, kDim}, ckpt::dtype::float32}}, false, {{"n", "4.5"}});
    FAIL("expected an error");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::errc::usage);
    CHECK(e.message().find("'n' (int): '4.5'") != std::string::npos);
  }
  try {
    ckpt::run_on_meta("toy.pt", *f.ar, "forward", {{{3, kDim + 1}, ckpt::dtype::float32}});
    FAIL("expected an error");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::errc::usage);
    CHECK(e.one_line().find('\n') == std::string::npos);
    CHECK(e.one_line().find("toy.pt") != std::string::npos);
  }
  try {
    ckpt::run_on_meta("toy.pt", *f.ar, "no_such_method", {});
    FAIL("expected an error");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::errc::usage);
    CHECK(e.message().find("evaluation_step") != std::string::npos);
  }
}

TEST_CASE("a torch.save archive is not TorchScript") {
  // torch::pickle_save writes what Python's torch.save does (torch::save writes TorchScript).
  const std::vector<char> s = torch::pickle_save(c10::IValue(torch::ones({4})));
  ckpt::memory_source src(std::vector<uint8_t>(s.begin(), s.end()), "tensor.pt");
  auto ar = ckpt::zip::archive::open(src);
  try {
    ckpt::inspect_torchscript("tensor.pt", *ar);
    FAIL("expected an error");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::errc::unsupported);
    CHECK(e.message().find("not a TorchScript archive") != std::string::npos);
    CHECK(e.file() == "tensor.pt");
  }
}
