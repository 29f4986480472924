#include "ckpt/materialize.h"

#include <chrono>
#include <ostream>
#include <streambuf>

#include <torch/cuda.h>

#include "torch/aten_types.h"
#include "ckpt/error.h"
#include "ckpt/load.h"
#include "ckpt/load_slices.h"
#include "ckpt/output_set.h"
#include "torch/finite_check.h"
#include "torch/meta_kernels.h"
#include "torch/method_args.h"
#include "torch/torch_message.h"
#include "torch/aoti_swap.h"
#include "torch/run_exported.h"
#include "torch/run_outputs.h"

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

// Module::save writes through an ostream: this one hands every byte to the output (a
// temporary file or a stream alike) and keeps the first error, which LibTorch would
// otherwise turn into a message without the file's name or the cause.
class output_streambuf : public std::streambuf {
 public:
  explicit output_streambuf(output_file& out) : out_(out) {}
  std::exception_ptr failure() const { return failure_; }

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (failure_) return 0;
    try {
      out_.write(s, size_t(n));
      written_ += uint64_t(n);
      out_.start_writeback(written_);
    } catch (...) {
      failure_ = std::current_exception();
      return 0;
    }
    return n;
  }
  int_type overflow(int_type ch) override {
    if (traits_type::eq_int_type(ch, traits_type::eof())) return traits_type::not_eof(ch);
    char c = traits_type::to_char_type(ch);
    return xsputn(&c, 1) == 1 ? ch : traits_type::eof();
  }

 private:
  output_file& out_;
  uint64_t written_ = 0;
  std::exception_ptr failure_;
};

void save_module(torch::jit::Module& m, output_file& out) {
  output_streambuf buf(out);
  std::ostream os(&buf);
  try {
    m.save(os);
  } catch (const c10::Error&) {
    if (buf.failure()) std::rethrow_exception(buf.failure());
    throw;
  }
  if (buf.failure()) std::rethrow_exception(buf.failure());
  if (!os) throw error(errc::io, "write failed").with_file(out.path());
}

// The interpreter rewraps an operator's failure, allocation failures included, as a plain
// error carrying the allocator's text.
bool is_out_of_memory(const std::string& msg) {
  return msg.find("out of memory") != std::string::npos || msg.find("can't allocate memory") != std::string::npos;
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
  detail::bound_call call = detail::bind_call(m, req.run_method, inputs, req.run_args);
  torch::NoGradGuard no_grad;
  c10::IValue out;
  // A method that rejects the inputs given on the command line (dtype, shape, count) is a
  // usage error, reported as the line of the interpreter's message that names the cause;
  // out of memory is the machine's (exit 4). The interpreter rethrows non-c10 errors as
  // std::runtime_error with its traceback, hence the second catch.
  auto fail = [&](const std::string& what) {
    std::string line = detail::condense_torch_message(what);
    if (is_out_of_memory(line))
      throw error(dev.is_cuda() ? errc::device : errc::io, "--run " + req.run_method + ": out of memory on " + dev.str() + ": " + line);
    throw error(errc::usage, "--run " + req.run_method + " failed: " + line);
  };
  try {
    out = call.method(std::move(call.args));
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const c10::Error& e) {
    fail(e.what_without_backtrace());
  } catch (const error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    fail(e.what());
  }
  synchronize(dev);
  r.run_method = req.run_method;
  detail::record_outputs(out, "", r);
}

}  // namespace

materialize_report materialize(checkpoint& c, const materialize_request& req) {
  // A torch.export archive the CLI has filled already (formats.md §14.9): only --run is left.
  if (!req.model.empty() && !req.run_method.empty() && !req.aoti_model && detail::is_exported_program(req.model))
    return detail::run_exported(req);
  if (req.aoti_model) {
    try {
      return detail::materialize_aoti(c, req);
    } catch (const c10::Error& e) {
      throw error(errc::unsupported, "LibTorch: " + one_line(e.what_without_backtrace()));
    }
  }
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
  o.allow_code = req.allow_code;
  o.model_built = req.model_built;
  if (!req.run_method.empty() && req.model.empty()) throw error(errc::usage, "--run needs --model");
  if (req.output && o.device.is_meta()) throw error(errc::usage, "-o cannot write meta tensors' data; use a real device");
  if (req.check_finite && o.device.is_meta())
    throw error(errc::usage, "--check-finite cannot check values on meta (meta tensors have none); use --device cpu or cuda");

  try {
    if (req.slices) {
      if (!req.model.empty()) throw error(errc::usage, "--plan cannot be combined with --model");
      slice_load_report sr;
      auto t0 = std::chrono::steady_clock::now();
      auto tensors = load_tensors(c, o, *req.slices, &sr);
      synchronize(o.device);
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.tensors = tensors.size();
      r.bytes = sr.bytes_read;
      r.dtype_converted = sr.converted;
      if (req.check_finite) r.non_finite = detail::non_finite(tensors);
      // A slice is a new tensor, not the saved object: written plain (no Parameter, no
      // attributes), each with a storage of its own.
      if (req.output && r.non_finite.empty()) {
        save_tensors(tensors, *req.output);
        r.output_written = true;
      }
      r.slices = std::move(sr);
    } else if (!req.model.empty()) {
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
      r.from_model_file = mr.from_model_file;
      r.bytes = mr.bytes;
      std::vector<std::pair<std::string, at::Tensor>> all;
      for (const auto& p : m.named_parameters(true)) all.emplace_back(p.name, p.value);
      for (const auto& b : m.named_buffers(true)) all.emplace_back(b.name, b.value);
      r.tensors = all.size();
      if (req.check_finite) r.non_finite = detail::non_finite(all);
      // Saved before --run: running a module in training mode updates its buffers
      // (BatchNorm statistics), and OUT must hold exactly the checkpoint's values.
      // --check-finite that fails writes nothing.
      if (req.output && r.non_finite.empty()) {
        save_module(m, *req.output);
        r.output_written = true;
      }
      if (!req.run_method.empty()) {
        if (o.device.is_meta()) detail::ensure_meta_kernels();
        run_method(m, req, o.device, r);
      }
    } else {
      auto t0 = std::chrono::steady_clock::now();
      // -o writes each tensor's recorded state (Parameter, requires_grad, attributes), which
      // points into the pickle tree: the tree is freed early only when nothing is written.
      const bool release = req.release_input && !req.output;
      auto tensors = release ? load_tensors_releasing(c, o, &r.dtype_converted) : load_tensors(c, o, &r.dtype_converted);
      synchronize(o.device);
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.tensors = tensors.size();
      for (const auto& s : c.storages) r.bytes += o.device.is_meta() ? 0 : s.nbytes;
      r.storages = c.storages.size();
      if (req.check_finite) r.non_finite = detail::non_finite(tensors);
      if (req.output && r.non_finite.empty()) {
        save_tensors(tensors, tensor_states(c), *req.output);
        r.output_written = true;
      }
    }
  } catch (const c10::OutOfMemoryError& e) {
    // The CPU allocator's and CUDA's allocation failures (exit 4, like std::bad_alloc).
    throw error(o.device.is_cuda() ? errc::device : errc::io,
                "out of memory on " + r.device + ": " + detail::condense_torch_message(e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    std::string msg = one_line(e.what_without_backtrace());
    bool oom = is_out_of_memory(msg);
    throw error(oom ? (o.device.is_cuda() ? errc::device : errc::io) : errc::unsupported,
                (oom ? "out of memory on " + r.device + ": " : "LibTorch: ") + msg);
  }
  return r;
}

}  // namespace ckpt
