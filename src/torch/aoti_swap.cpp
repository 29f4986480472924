// materialize CKPT --model PKG.pt2 for an AOTInductor package: the checkpoint's tensors
// replace the package's constants, then the model runs (formats.md §15.5). The plan was
// checked against the package's constants table before this file is reached; here the
// library is loaded (its code runs), its own table is compared with the one read from
// wrapper.cpp, and each constant gets a fresh tensor of exactly its dtype, shape, strides
// and size, since LibTorch's swap copies whatever it is handed.
//
// The package is extracted by ckptool into a directory of its own, removed on every path,
// and the model runner is created directly: LibTorch's AOTIModelPackageLoader extracts
// into a fresh /tmp/XXXXXX that it leaves behind when its constructor throws.
#include "torch/aoti_swap.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include "ckpt/aoti.h"
#include "ckpt/error.h"
#include "ckpt/file_opener.h"
#include "ckpt/load.h"
#include "io/temp_registry.h"
#include "model/assembly.h"
#include "model/read_plan.h"
#include "plugin/module_loader.h"
#include "torch/aten_types.h"
#include "torch/finite_check.h"
#include "torch/loader/assembled_loader.h"
#include "torch/loader/storage_loader.h"
#include "torch/torch_message.h"

namespace ckpt::detail {
namespace {

// A directory of ckptool's own under $TMPDIR, removed with everything in it when this
// goes out of scope; held by the signal handlers meanwhile (its files are flat).
class scratch_dir {
 public:
  scratch_dir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/ckptool-aoti-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw error(errc::io, "cannot create a directory in " + tmpl.substr(0, tmpl.size() - 19));
    path_ = tmpl;
    slot_ = temp_registry::hold_directory(path_.c_str());
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    if (slot_ >= 0) temp_registry::release(slot_);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int slot_ = -1;
};

// The model's records, CRC-checked, written flat into `dir` (AOTI writes them flat).
std::map<std::string, std::string> extract(const std::string& package, const aoti::model& m, const std::string& dir) {
  file_source src(package);
  auto ar = zip::archive::open(src);
  std::map<std::string, std::string> out;  // record -> extracted path
  for (const auto& f : m.files) {
    const zip::entry* e = ar->find(f.record);
    if (!e) throw error(errc::io, "record " + f.record + " disappeared from the package").with_file(package);
    std::string base = f.record.substr(f.record.rfind('/') + 1);
    checked_relative_path(base);
    ar->verify_crc(*e);
    std::string path = dir + "/" + base;
    FILE* fp = std::fopen(path.c_str(), "wbx");
    if (!fp) throw error(errc::io, "cannot write " + path);
    std::unique_ptr<FILE, int (*)(FILE*)> guard(fp, &std::fclose);
    auto put = [&](const void* p, size_t n) {
      if (n && std::fwrite(p, 1, n, fp) != n) throw error(errc::io, "cannot write " + path);
    };
    if (e->method == 0) {
      std::vector<uint8_t> buf(std::min<uint64_t>(e->uncompressed_size, 8u << 20));
      for (uint64_t done = 0; done < e->uncompressed_size;) {
        size_t n = size_t(std::min<uint64_t>(buf.size(), e->uncompressed_size - done));
        src.read_exact(e->data_offset + done, buf.data(), n);
        put(buf.data(), n);
        done += n;
      }
    } else {
      auto bytes = ar->read_record(*e);
      put(bytes.data(), bytes.size());
    }
    if (std::fflush(fp) != 0) throw error(errc::io, "cannot write " + path);
    out[f.record] = path;
  }
  return out;
}

// The model library names libtorch.so and carries no search path of its own, and a
// RUNPATH (ours) does not apply to what a dlopen'd library needs (formats.md §15.5): the
// libtorch.so beside the libtorch_cpu.so in this process is loaded first, by its path, so
// the library's dependency resolves to it.
void preload_libtorch() {
  static std::string problem = [] {
    std::string dir = directory_of_code_at(reinterpret_cast<const void*>(&aoti_torch_dtype_float32));
    std::string path = dir + "/libtorch.so";
    if (::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) return std::string();
    const char* why = ::dlerror();
    return "an AOTInductor model library needs " + path + ": " + (why ? why : "cannot be loaded");
  }();
  if (!problem.empty()) throw error(errc::unsupported, problem);
}

std::vector<at::Tensor> make_inputs(const materialize_request& req, const aoti::model& m, const c10::Device& dev) {
  if (req.run_inputs.size() != m.num_inputs)
    throw error(errc::usage, "--run: the package's model takes " + std::to_string(m.num_inputs) + " tensor inputs; " +
                                 std::to_string(req.run_inputs.size()) + " --input given");
  if (!req.run_args.empty()) throw error(errc::usage, "--arg: an AOTInductor model takes tensors only");
  std::vector<at::Tensor> inputs;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  for (size_t i = 0; i < req.run_inputs.size(); ++i) {
    const input_spec& in = req.run_inputs[i];
    const aoti::input_check& want = m.inputs[i];
    // The generated checks run only when AOTI_RUNTIME_CHECK_INPUTS is set; without them a
    // wrong shape reads out of bounds. Checked here, from wrapper.cpp's own checks.
    const std::string who = "--input " + std::to_string(i + 1) + " (" + want.name + "): ";
    if (!want.dtype_text.empty() && want.dtype_text != name(in.type))
      throw error(errc::usage, who + "the model expects " + want.dtype_text + ", not " + name(in.type));
    if (!want.dims.empty() && in.shape.size() < want.dims.size())
      throw error(errc::usage, who + "the model expects at least " + std::to_string(want.dims.size()) + " dimensions");
    if (!want.strides.empty() && in.shape.size() != want.strides.size())
      throw error(errc::usage, who + "the model expects " + std::to_string(want.strides.size()) + " dimensions");
    for (const auto& d : want.dims) {
      int64_t v = in.shape[size_t(d.dim)];
      if ((d.size && v != *d.size) || (d.min && v < *d.min) || (d.max && v > *d.max))
        throw error(errc::usage, who + "dimension " + std::to_string(d.dim) + " is " + std::to_string(v) + "; the model expects " +
                                     (d.size ? std::to_string(*d.size)
                                             : std::to_string(d.min.value_or(0)) + ".." +
                                                   (d.max ? std::to_string(*d.max) : std::string("any"))));
    }
    c10::ScalarType st = scalar_type(in.type);
    at::Tensor t = at::isFloatingType(st) ? at::randn(in.shape, gen, at::TensorOptions().dtype(at::kFloat)).to(st)
                                          : at::zeros(in.shape, at::TensorOptions().dtype(st));
    inputs.push_back(t.to(dev).contiguous());
  }
  return inputs;
}

}  // namespace

materialize_report materialize_aoti(checkpoint& c, const materialize_request& req) {
  const aoti::model& m = *req.aoti_model;
  const aoti::swap_plan& plan = *req.aoti_plan;
  materialize_report r;
  c10::Device dev(req.device);
  if (dev.is_meta() || c10::DeviceTypeName(dev.type(), true) != m.device)
    throw error(errc::usage, "--device " + req.device + ": the package was compiled for " + m.device);
  check_device(dev);
  if (req.output) throw error(errc::usage, "-o: a swapped AOTInductor package is not written; use --run");
  if (!req.dtype.empty()) throw error(errc::usage, "--dtype: a package's constants keep the dtypes it was compiled with");
  if (!req.run_method.empty() && req.run_method != "forward")
    throw error(errc::usage, "--run " + req.run_method + ": an AOTInductor model has one entry point, forward");
  r.device = dev.str();
  r.key_edit = plan.key_edit;
  r.filled_from_model = plan.kept;
  load_options o;
  o.device = dev;
  o.threads = req.threads;
  o.progress = req.progress;

  auto t0 = std::chrono::steady_clock::now();
  // Only the storages of the keys that are swapped are read.
  std::unordered_map<std::string, size_t> key_index;
  for (size_t k = 0; k < c.keys.size(); ++k) key_index[std::string(c.keys.key(k))] = k;
  std::vector<size_t> selected, assembled_keys;
  for (const auto& p : plan.pairs) {
    const size_t k = key_index.at(p.key);
    if (is_assembled(c.keys, k))
      assembled_keys.push_back(k);
    else
      selected.push_back(c.keys.tensor(k));
  }
  std::vector<bool> needed = storages_of(c, selected);
  for (size_t i = 0; i < needed.size(); ++i)
    if (needed[i]) r.bytes += c.storages[i].nbytes;
  loaded_tensors loaded = load_with_pieces(c, std::move(needed), selected, assembled_keys, o);
  r.bytes += loaded.piece_bytes;

  // One fresh tensor per constant: its own storage, offset 0, the table's strides, no
  // larger than its slot.
  std::unordered_map<std::string, at::Tensor> by_name;
  std::vector<std::pair<std::string, at::Tensor>> swapped;
  for (const auto& p : plan.pairs) {
    const aoti::constant& k = m.constants.at(p.constant);
    const size_t key = key_index.at(p.key);
    at::Tensor src = is_assembled(c.keys, key) ? loaded.assembled.at(key)
                                               : view_of(c.tensors[c.keys.tensor(key)], loaded.storages, dev);
    const c10::ScalarType st = scalar_type(*k.type);
    if (src.layout() != at::kStrided || src.scalar_type() != st || src.sizes().vec() != k.shape)
      throw error(errc::unsupported, "checkpoint key " + p.key + " is not a dense " + std::string(name(*k.type)) +
                                         " tensor of the constant's shape");
    at::Tensor dst = at::empty_strided(k.shape, k.stride, at::TensorOptions().dtype(st).device(dev));
    dst.copy_(src);
    if (dst.storage_offset() != 0 || dst.storage().nbytes() > k.data_size)
      throw error(errc::unsupported, "constant " + k.name + ": its strides need " + std::to_string(dst.storage().nbytes()) +
                                         " bytes, more than its " + std::to_string(k.data_size) + "-byte slot");
    by_name[k.name] = dst;
    swapped.emplace_back(k.original_fqn, dst);
  }
  loaded = loaded_tensors{};
  r.tensors = swapped.size();
  if (req.check_finite) r.non_finite = non_finite(swapped);

  // Inputs are checked before the library is loaded: a mistake costs no code run.
  std::vector<at::Tensor> inputs;
  if (!req.run_method.empty()) inputs = make_inputs(req, m, dev);

  try {
    preload_libtorch();
    scratch_dir dir;
    std::map<std::string, std::string> files = extract(req.model, m, dir.path());
    // The model's own input checks (off unless this is set) back up make_inputs' checks.
    ::setenv("AOTI_RUNTIME_CHECK_INPUTS", "1", 1);
    auto& registry = torch::inductor::getAOTIModelRunnerRegistry();
    auto create = registry.find(m.device);
    if (create == registry.end())
      throw error(errc::unsupported, "this LibTorch has no AOTInductor runner for device " + m.device);
    {
      std::unique_ptr<torch::inductor::AOTIModelContainerRunner> runner =
          create->second(files.at(m.library_record), 1, m.device, dir.path(), false);
      // The library must hold the table ckptool checked against: the same constants, names
      // and dtypes as its wrapper.cpp says.
      auto fqns = runner->getConstantNamesToOriginalFQNs();
      auto dtypes = runner->getConstantNamesToDtypes();
      bool same = fqns.size() == m.constants.size();
      for (const auto& k : m.constants) {
        auto f = fqns.find(k.name);
        auto d = dtypes.find(k.name);
        same = same && f != fqns.end() && f->second == k.original_fqn && d != dtypes.end() && k.type &&
               d->second == int32_t(scalar_type(*k.type));
      }
      if (!same)
        throw error(errc::unsupported, "the model library's constants differ from its wrapper.cpp's table; refusing to swap")
            .with_file(req.model);
      if (!m.blob_record.empty()) runner->update_constant_buffer_from_blob(files.at(m.blob_record));
      // The active buffer is updated in place: nothing runs meanwhile, and constants the
      // checkpoint does not hold (--no-strict) keep the package's values.
      runner->update_constant_buffer(by_name, /*use_inactive=*/false, /*validate_full_updates=*/false);
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!req.run_method.empty()) {
        std::vector<at::Tensor> outs = runner->run(inputs);
        r.run_method = "forward";
        for (size_t i = 0; i < outs.size(); ++i) {
          meta_output x;
          x.path = i < m.output_names.size() && !m.output_names[i].empty() ? m.output_names[i] : std::to_string(i);
          x.is_tensor = true;
          x.type = "Tensor";
          x.dtype = c10::getDtypeNames(outs[i].scalar_type()).first;
          x.shape = outs[i].sizes().vec();
          r.outputs.push_back(x);
          r.checksums.push_back(outs[i].numel() ? outs[i].to(at::kCPU).to(at::kDouble).sum().item<double>() : 0.0);
        }
      }
    }
  } catch (const error&) {
    throw;
  } catch (const c10::Error& e) {
    throw error(errc::unsupported, "LibTorch: " + condense_torch_message(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw error(errc::unsupported, "AOTInductor runtime: " + condense_torch_message(e.what()));
  }
  return r;
}

}  // namespace ckpt::detail
