#include "ckpt/materialize.h"

#include <chrono>
#include <cmath>
#include <sstream>

#include <torch/cuda.h>

#include "aten_types.h"
#include "ckpt/atomic_file.h"
#include "ckpt/error.h"
#include "ckpt/load.h"
#include "meta_kernels.h"

namespace ckpt {
namespace {

// LibTorch's messages span lines (an interpreter traceback, then the cause): keep them,
// on one line, bounded.
std::string one_line(const std::string& msg) {
  std::string out;
  bool space = false;
  for (char ch : msg) {
    if (ch == '\n' || ch == '\r' || ch == '\t' || ch == ' ') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += ch;
  }
  if (out.size() > 600) out = out.substr(0, 600) + " ...";
  return out;
}

c10::Device parse_device(const std::string& s) {
  try {
    return c10::Device(s);
  } catch (const c10::Error&) {
    throw error(errc::usage, "--device " + s + ": expected cpu, cuda, cuda:N or meta");
  }
}

void synchronize(const c10::Device& d) {
#ifdef CKPTOOL_WITH_CUDA
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
#endif
}

// --run: deterministic inputs (fixed seed; integer inputs are zeros, valid as class
// indices), so checksums compare across runs and devices.
void run_method(torch::jit::Module& m, const materialize_request& req, const c10::Device& dev, materialize_report& r) {
  std::vector<c10::IValue> inputs;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  for (const auto& in : req.run_inputs) {
    c10::ScalarType st = detail::scalar_type(in.type);
    at::Tensor t = at::isFloatingType(st) ? at::randn(in.shape, gen, at::TensorOptions().dtype(at::kFloat)).to(st)
                                          : at::zeros(in.shape, at::TensorOptions().dtype(st));
    inputs.push_back(t.to(dev));
  }
  auto method = m.find_method(req.run_method);
  if (!method) throw error(errc::usage, "--run: the model has no method '" + req.run_method + "'");
  torch::NoGradGuard no_grad;
  c10::IValue out;
  try {
    out = (*method)(inputs);
  } catch (const c10::Error& e) {
    throw error(errc::usage, "--run " + req.run_method + " failed: " + one_line(e.what_without_backtrace()));
  }
  synchronize(dev);
  r.run_method = req.run_method;
  std::function<void(const c10::IValue&, const std::string&)> flatten = [&](const c10::IValue& v, const std::string& path) {
    if (v.isTensor()) {
      at::Tensor t = v.toTensor();
      meta_output o;
      o.path = path;
      o.is_tensor = true;
      o.type = "Tensor";
      o.dtype = c10::getDtypeNames(t.scalar_type()).first;
      o.shape = t.sizes().vec();
      r.outputs.push_back(o);
      // Meta tensors have shapes but no values: no checksum (NaN, null in JSON).
      r.checksums.push_back(t.is_meta() ? std::nan("") : t.numel() ? t.to(at::kDouble).sum().item<double>() : 0.0);
    } else if (v.isTuple() || v.isList()) {
      auto elems = v.isTuple() ? v.toTupleRef().elements().vec() : v.toListRef().vec();
      for (size_t i = 0; i < elems.size(); ++i) flatten(elems[i], path.empty() ? std::to_string(i) : path + "." + std::to_string(i));
    } else {
      meta_output o;
      o.path = path;
      o.type = v.tagKind();
      std::ostringstream s;
      s << v;
      o.value = s.str().substr(0, 80);
      r.outputs.push_back(o);
      r.checksums.push_back(0.0);
    }
  };
  flatten(out, "");
}

std::vector<std::string> non_finite(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<std::string> bad;
  for (const auto& [name, t] : tensors) {
    if (t.is_meta() || !at::isFloatingType(t.scalar_type()) || t.numel() == 0) continue;
    // float8 types have no isfinite kernel; float32 holds every value they can.
    at::Tensor probe = t.element_size() < 2 ? t.to(at::kFloat) : t;
    if (!at::isfinite(probe).all().item<bool>()) bad.push_back(name);
  }
  return bad;
}

}  // namespace

materialize_report materialize(checkpoint& c, const materialize_request& req) {
  materialize_report r;
#ifdef CKPTOOL_WITH_CUDA
  r.cuda_build = true;
#endif
  load_options o;
  o.device = parse_device(req.device);
  r.device = o.device.str();
  if (!req.dtype.empty()) {
    auto d = dtype_from_name(req.dtype);
    if (!d || !info(*d).is_floating) throw error(errc::usage, "--dtype " + req.dtype + ": expected a floating type such as bfloat16");
    o.dtype = detail::scalar_type(*d);
  }
  o.mmap = req.mmap;
  // A materialize that returns before the pages are in memory would report a lazy map as a
  // load; the library leaves the choice to the caller.
  o.populate = req.mmap;
  o.threads = req.threads;
  o.progress = req.progress;
  if (!req.run_method.empty() && req.model.empty()) throw error(errc::usage, "--run needs --model");
  if (!req.output.empty() && o.device.is_meta()) throw error(errc::usage, "-o cannot write meta tensors' data; use a real device");

  try {
    if (!req.model.empty()) {
      module_load_report mr;
      auto t0 = std::chrono::steady_clock::now();
      torch::jit::Module m = load_module(req.model, c, o, req.strict, &mr);
      synchronize(o.device);
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.key_edit = mr.key_edit;
      r.missing = mr.missing;
      r.unexpected = mr.unexpected;
      r.shape_mismatched = mr.shape_mismatched;
      r.dtype_converted = mr.dtype_converted;
      r.filled_from_model = mr.filled_from_model;
      r.bytes = mr.bytes;
      std::vector<std::pair<std::string, at::Tensor>> all;
      for (const auto& p : m.named_parameters(true)) all.emplace_back(p.name, p.value);
      for (const auto& b : m.named_buffers(true)) all.emplace_back(b.name, b.value);
      r.tensors = all.size();
      if (req.check_finite) r.non_finite = non_finite(all);
      // Saved before --run: running a module in training mode updates its buffers
      // (BatchNorm statistics), and OUT must hold exactly the checkpoint's values.
      if (!req.output.empty()) {
        atomic_output out(req.output);
        m.save(out.temp_path());
        out.commit();
      }
      if (!req.run_method.empty()) {
        if (o.device.is_meta()) detail::ensure_meta_kernels();
        run_method(m, req, o.device, r);
      }
    } else {
      auto t0 = std::chrono::steady_clock::now();
      auto tensors = req.release_input ? load_tensors_releasing(c, o, &r.dtype_converted)
                                       : load_tensors(c, o, &r.dtype_converted);
      synchronize(o.device);
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.tensors = tensors.size();
      for (const auto& s : c.storages) r.bytes += o.device.is_meta() ? 0 : s.nbytes;
      r.storages = c.storages.size();
      if (req.check_finite) r.non_finite = non_finite(tensors);
      if (!req.output.empty()) save_tensors(tensors, req.output);
    }
  } catch (const c10::Error& e) {
    std::string msg = one_line(e.what_without_backtrace());
    bool oom = msg.find("out of memory") != std::string::npos;
    throw error(oom ? errc::device : errc::unsupported, (oom ? "out of memory on " + r.device + ": " : "LibTorch: ") + msg);
  }
  return r;
}

}  // namespace ckpt
