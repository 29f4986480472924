#include "ckpt/torchscript.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/torchscript_code.h"
#include "torch/torchscript_module.h"
#include "torch/meta_kernels.h"
#include "torch/method_args.h"
#include "torch/torch_message.h"

namespace ckpt {
namespace {

struct byte_range {
  uint64_t begin;
  uint64_t end;
};

// Serves the file to PyTorchStreamReader, except for reads of the stored data/ and
// constants/ records: those it reports as done but leaves the destination untouched.
// LibTorch reads each storage into a fresh CPU allocation and immediately moves it to meta
// (unpickler.cpp, BINPERSID), so the bytes are never looked at; the allocation stays
// untouched virtual memory, and nothing is read from disk. This relies on PyTorch's miniz
// being built with MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS (it is, in every release since
// 1.x); otherwise the loader would checksum the skipped bytes and refuse them.
class skipping_adapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  skipping_adapter(const byte_source& src, std::vector<byte_range> skip)
      : src_(src), skip_(std::move(skip)) {
    std::sort(skip_.begin(), skip_.end(),
              [](const byte_range& a, const byte_range& b) { return a.begin < b.begin; });
  }

  size_t size() const override { return size_t(src_.size()); }

  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    const uint64_t total = src_.size();
    if (pos >= total) return 0;
    n = size_t(std::min<uint64_t>(n, total - pos));
    // Only reads that lie wholly inside one tensor record are skipped: that is how miniz
    // extracts a stored record (one read of exactly its data), and how chunked or
    // multi-reader extraction would slice it. Anything straddling a boundary (miniz's scan
    // of the file's last 4 KiB for the end record) gets the real bytes.
    auto it = std::upper_bound(skip_.begin(), skip_.end(), pos,
                               [](uint64_t v, const byte_range& r) { return v < r.begin; });
    if (it != skip_.begin()) {
      const byte_range& r = *std::prev(it);
      if (pos >= r.begin && pos + n <= r.end) {
        skipped_.fetch_add(n, std::memory_order_relaxed);
        return n;
      }
    }
    try {
      src_.read_exact(pos, buf, n);
    } catch (...) {
      // Exceptions must not unwind through miniz (C); a short read makes the loader fail,
      // and load_on_meta then reports this error rather than miniz's vaguer one.
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
      return 0;
    }
    read_.fetch_add(n, std::memory_order_relaxed);
    return n;
  }

  uint64_t bytes_read() const { return read_.load(std::memory_order_relaxed); }
  uint64_t bytes_skipped() const { return skipped_.load(std::memory_order_relaxed); }
  std::exception_ptr first_error() const {
    std::lock_guard<std::mutex> lock(error_mutex_);
    return error_;
  }

 private:
  const byte_source& src_;
  std::vector<byte_range> skip_;
  mutable std::atomic<uint64_t> read_{0};
  mutable std::atomic<uint64_t> skipped_{0};
  mutable std::mutex error_mutex_;
  mutable std::exception_ptr error_;
};

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

std::string condense(std::string_view msg) { return detail::condense_torch_message(msg); }

// PyTorch's text for a missing meta kernel is a paragraph about torch.compile fake
// impls; say instead what it means here.
std::string explain_missing_meta_kernel(std::string msg) {
  const size_t pos = msg.find(": attempted to run this operator with Meta tensors");
  if (pos == std::string::npos) return msg;
  const std::string op = msg.substr(0, pos);
  static const char* const kValueDependent[] = {
      "aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::equal",
      "aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique",
      "aten::bincount", "aten::repeat_interleave", "aten::histc", "aten::_assert_async"};
  for (const char* v : kValueDependent)
    if (starts_with(op, v))
      return op + " needs tensor values (.item(), bool(tensor), data-dependent control flow "
                  "or output size), which meta tensors do not have";
  return op + " has no meta kernel in LibTorch's C++ library";
}

enum class stage { load, run };

// What LibTorch says is mapped to the error kinds of error.h. A load that fails after our
// own zip reader accepted the archive is mostly something this LibTorch cannot handle
// (custom classes, unknown operators, newer versions), hence `unsupported`, except for
// failures in reading the container or its pickles. A run fails either because the meta
// device cannot do something (no meta kernel, values needed) or because the inputs do not
// fit the method.
errc classify(stage st, std::string_view msg, bool not_implemented) {
  // Allocation failures the interpreter rewrapped as plain errors: the machine's (exit 4).
  if (contains(msg, "DefaultCPUAllocator: can't allocate memory") || contains(msg, "CUDA out of memory")) return errc::io;
  if (st == stage::load) {
    if (contains(msg, "PytorchStreamReader") || contains(msg, "pickle") ||
        contains(msg, "Unpickler") || contains(msg, "unpickl"))
      return errc::corrupt;
    return errc::unsupported;
  }
  if (not_implemented || contains(msg, "'Meta' backend") || contains(msg, "meta tensor") ||
      contains(msg, "meta kernel") ||
      contains(msg, "meta device") || contains(msg, "Meta device") ||
      contains(msg, "data-dependent") || contains(msg, "data dependent"))
    return errc::unsupported;
  return errc::usage;
}

// Runs `fn`, turning LibTorch's exceptions into ckpt::error naming `path`.
template <class Fn>
auto translate_errors(const std::string& path, stage st, const std::string& what,
                      const skipping_adapter* adapter, Fn&& fn) -> decltype(fn()) {
  auto adapter_error = [&]() {
    if (adapter)
      if (auto ep = adapter->first_error()) std::rethrow_exception(ep);
  };
  try {
    return fn();
  } catch (error& e) {
    e.with_file(path);
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    throw error(errc::io, what + "out of memory: " + condense(e.what_without_backtrace())).with_file(path);
  } catch (const c10::NotImplementedError& e) {
    adapter_error();
    std::string m = explain_missing_meta_kernel(condense(e.what_without_backtrace()));
    throw error(classify(st, m, true), what + m).with_file(path);
  } catch (const c10::Error& e) {
    adapter_error();
    std::string m = explain_missing_meta_kernel(condense(e.what_without_backtrace()));
    throw error(classify(st, m, false), what + m).with_file(path);
  } catch (const std::bad_alloc&) {
    throw error(errc::io, what + "out of memory").with_file(path);
  } catch (const std::exception& e) {
    adapter_error();
    std::string m = explain_missing_meta_kernel(condense(e.what()));
    throw error(classify(st, m, false), what + m).with_file(path);
  }
}

// c10 names dtypes the way Python prints them ("float32", "int64", "bool", ...).
std::string dtype_name(c10::ScalarType t) { return c10::getDtypeNames(t).first; }

c10::ScalarType to_scalar_type(dtype t) {
  const auto& by_name = c10::getStringToDtypeMap();
  auto it = by_name.find(name(t));
  if (it == by_name.end())
    throw error(errc::unsupported,
                std::string("dtype ") + name(t) + " has no LibTorch equivalent");
  return it->second;
}

std::string type_name(const c10::TypePtr& t) { return t->annotation_str(); }

std::string class_name(const torch::jit::Module& m) {
  const auto& qn = m.type()->name();
  return qn ? qn->qualifiedName() : m.type()->str();
}

std::string double_repr(double d) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d);  // shortest round-trip, like Python
  std::string s(buf, res.ptr);
  if (s == "inf") return "inf";
  if (s == "-inf") return "-inf";
  if (s == "nan" || s == "-nan") return "nan";
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string string_repr(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += '?';
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Python-like rendering of simple values; false (and `out` unusable) for anything holding
// tensors, objects or more than `budget` characters.
bool render(const c10::IValue& v, std::string& out, size_t budget) {
  auto append_seq = [&](const std::vector<c10::IValue>& items, const char* open,
                        const char* close, bool tuple) {
    out += open;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += ", ";
      if (!render(items[i], out, budget)) return false;
      if (out.size() > budget) return false;
    }
    if (tuple && items.size() == 1) out += ",";
    out += close;
    return true;
  };
  if (v.isNone()) {
    out += "None";
  } else if (v.isBool()) {
    out += v.toBool() ? "True" : "False";
  } else if (v.isInt()) {
    out += std::to_string(v.toInt());
  } else if (v.isDouble()) {
    out += double_repr(v.toDouble());
  } else if (v.isString()) {
    out += string_repr(v.toStringRef());
  } else if (v.isDevice()) {
    out += "device(" + string_repr(v.toDevice().str()) + ")";
  } else if (v.isTuple()) {
    const auto& elems = v.toTupleRef().elements();
    if (!append_seq(std::vector<c10::IValue>(elems.begin(), elems.end()), "(", ")", true))
      return false;
  } else if (v.isList()) {
    if (!append_seq(v.toList().vec(), "[", "]", false)) return false;
  } else if (v.isGenericDict()) {
    out += "{";
    bool first = true;
    for (const auto& kv : v.toGenericDict()) {
      if (!first) out += ", ";
      first = false;
      if (!render(kv.key(), out, budget)) return false;
      out += ": ";
      if (!render(kv.value(), out, budget)) return false;
      if (out.size() > budget) return false;
    }
    out += "}";
  } else {
    return false;
  }
  return out.size() <= budget;
}

std::string short_value(const c10::IValue& v) {
  constexpr size_t kMaxValueChars = 120;
  std::string s;
  return render(v, s, kMaxValueChars) ? s : std::string();
}

bool is_module_type(const c10::TypePtr& t) {
  if (auto ct = t->cast<c10::ClassType>()) return ct->is_module();
  if (auto it = t->cast<c10::InterfaceType>()) return it->is_module();
  return false;
}

// Module bookkeeping every nn.Module carries; listing them for each submodule is noise.
bool is_bookkeeping(const std::string& name) {
  return name == "training" || name == "_is_full_backward_hook";
}

void collect_attributes(const torch::jit::Module& m, const std::string& prefix,
                        std::vector<ts_attribute>& out) {
  const auto& t = m.type();
  for (size_t i = 0; i < t->numAttributes(); ++i) {
    const std::string name = t->getAttributeName(i);
    const c10::TypePtr& ty = t->getAttribute(i);
    if (t->is_parameter(i) || t->is_buffer(i) || is_bookkeeping(name) || is_module_type(ty))
      continue;
    c10::IValue v = m._ivalue()->getSlot(i);
    if (ty->kind() == c10::TypeKind::TensorType || v.isTensor()) continue;
    out.push_back({prefix + name, type_name(ty), short_value(v), false});
  }
  for (size_t i = 0; i < t->numConstants(); ++i) {
    c10::IValue v = t->getConstant(i);
    if (v.isTensor()) continue;
    out.push_back({prefix + t->getConstantName(i), type_name(v.type()), short_value(v), true});
  }
}

ts_tensor describe(const std::string& name, const at::Tensor& t) {
  ts_tensor d;
  d.name = name;
  d.dtype = dtype_name(t.scalar_type());
  d.shape.assign(t.sizes().begin(), t.sizes().end());
  return d;
}

std::string join_path(const std::string& base, const std::string& part) {
  return base.empty() ? part : base + "." + part;
}

void flatten(const c10::IValue& v, const std::string& path, std::vector<meta_output>& out) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    meta_output o;
    o.path = path;
    if (!t.defined()) {
      o.type = "Tensor";
      o.value = "undefined";
    } else {
      o.is_tensor = true;
      o.type = "Tensor";
      o.dtype = dtype_name(t.scalar_type());
      o.shape.assign(t.sizes().begin(), t.sizes().end());
    }
    out.push_back(std::move(o));
    return;
  }
  auto leaf = [&]() {
    meta_output o;
    o.path = path;
    o.type = type_name(v.type());
    o.value = short_value(v);
    out.push_back(std::move(o));
  };
  if (v.isTuple()) {
    const auto& elems = v.toTupleRef().elements();
    if (elems.empty()) return leaf();
    for (size_t i = 0; i < elems.size(); ++i)
      flatten(elems[i], join_path(path, std::to_string(i)), out);
  } else if (v.isList()) {
    auto list = v.toList();
    if (list.empty()) return leaf();
    for (size_t i = 0; i < list.size(); ++i)
      flatten(list.get(i), join_path(path, std::to_string(i)), out);
  } else if (v.isGenericDict()) {
    auto dict = v.toGenericDict();
    if (dict.empty()) return leaf();
    for (const auto& kv : dict) {
      std::string key;
      if (kv.key().isString()) {
        key = kv.key().toStringRef();
      } else if (!render(kv.key(), key, 60)) {
        key = "?";
      }
      flatten(kv.value(), join_path(path, key), out);
    }
  } else {
    leaf();
  }
}

// A schema as c10 prints it, except that a tensor default (CONSTANTS.cN in the code)
// shows as `<tensor float32[3]>`: c10 would print its values, which meta tensors lack.
std::string schema_text(const c10::FunctionSchema& schema) {
  std::vector<c10::Argument> args;
  std::vector<std::pair<std::string, std::string>> shown;
  for (const c10::Argument& a : schema.arguments()) {
    if (!a.default_value() || !a.default_value()->isTensor()) {
      args.push_back(a);
      continue;
    }
    const at::Tensor& t = a.default_value()->toTensor();
    std::string text = "<tensor";
    if (t.defined()) {
      text += " " + dtype_name(t.scalar_type()) + "[";
      for (int64_t d = 0; d < t.dim(); ++d) text += (d ? ", " : "") + std::to_string(t.size(d));
      text += "]";
    }
    text += ">";
    std::string marker = "ckptool_tensor_default_" + std::to_string(shown.size());
    shown.emplace_back(marker, text);
    args.emplace_back(a.name(), a.type(), a.real_type(), a.N(), c10::IValue(marker), a.kwarg_only(),
                      a.alias_info() ? std::optional<c10::AliasInfo>(*a.alias_info()) : std::nullopt);
  }
  std::ostringstream out;
  out << (shown.empty() ? schema : schema.cloneWithArguments(std::move(args)));
  std::string text = out.str();
  // c10 prints a string default bare, or quoted where it needs to; the markers need not.
  for (const auto& [marker, value] : shown) {
    size_t pos = text.find(marker);
    if (pos == std::string::npos) continue;
    size_t begin = pos, end = pos + marker.size();
    if (begin > 0 && end < text.size() && (text[begin - 1] == '"' || text[begin - 1] == '\'') &&
        text[end] == text[begin - 1]) {
      --begin;
      ++end;
    }
    text.replace(begin, end - begin, value);
  }
  return text;
}

void check_torchscript_archive(const zip::archive& ar) {
  if (ar.find("model.json"))
    throw error(errc::unsupported,
                "legacy TorchScript archive (model.json, PyTorch 1.0-1.2) is not supported");
  if (!ar.find("data.pkl"))
    throw error(errc::unsupported, "not a TorchScript archive: no data.pkl record");
  bool has_code = std::any_of(ar.entries().begin(), ar.entries().end(),
                              [](const zip::entry& e) { return starts_with(e.record, "code/"); });
  if (!has_code)
    throw error(errc::unsupported,
                "not a TorchScript archive: no code/ records (a torch.save checkpoint?)");
}

std::vector<byte_range> tensor_record_ranges(const zip::archive& ar) {
  std::vector<byte_range> out;
  for (const auto& e : ar.entries()) {
    // Deflated records must be inflated for real; torch.jit.save never compresses
    // tensor data, so this only matters for archives rewritten by other zip tools.
    if (e.method != 0 || e.compressed_size == 0) continue;
    if (starts_with(e.record, "data/") || starts_with(e.record, "constants/"))
      out.push_back({e.data_offset, e.data_offset + e.compressed_size});
  }
  return out;
}

}  // namespace

torch::jit::Module load_on_meta(const std::string& path, const zip::archive& ar,
                                meta_load_stats* stats, bool allow_code) {
  try {
    check_torchscript_archive(ar);
    refuse_unsafe_torchscript(ar);
    if (!allow_code) refuse_load_time_code(ar);
  } catch (error& e) {
    e.with_file(path);
    throw;
  }
  auto adapter = std::make_shared<skipping_adapter>(ar.source(), tensor_record_ranges(ar));
  torch::jit::Module m = translate_errors(path, stage::load, "cannot load TorchScript module: ",
                                          adapter.get(), [&]() {
    // load_debug_files=false: the code/*.debug_pkl source maps are only for tracebacks.
    detail::identity_equal_scope pooling_on_meta;
    return torch::jit::load(adapter, c10::Device(c10::kMeta), /*load_debug_files=*/false);
  });
  if (stats) {
    stats->bytes_read = adapter->bytes_read();
    stats->bytes_skipped = adapter->bytes_skipped();
  }
  return m;
}

torchscript_info inspect_torchscript(const std::string& path, const zip::archive& ar, bool allow_code) {
  meta_load_stats stats;
  torch::jit::Module m = load_on_meta(path, ar, &stats, allow_code);
  return translate_errors(path, stage::load, "cannot describe TorchScript module: ", nullptr,
                          [&]() {
    torchscript_info info;
    info.type = class_name(m);
    info.training = m.is_training();
    info.bytes_read = stats.bytes_read;
    info.bytes_skipped = stats.bytes_skipped;
    collect_attributes(m, "", info.attributes);
    for (const auto& nm : m.named_modules()) {
      if (nm.name.empty()) continue;  // the root itself
      info.submodules.push_back({nm.name, class_name(nm.value)});
      collect_attributes(nm.value, nm.name + ".", info.attributes);
    }
    // Tied weights are one tensor object under several names, as in torch.save files.
    std::unordered_map<const void*, std::string> first_name;
    auto tied = [&](ts_tensor d, const at::Tensor& t) {
      auto [it, fresh] = first_name.emplace(t.unsafeGetTensorImpl(), d.name);
      if (!fresh) d.tied_to = it->second;
      return d;
    };
    for (const auto& p : m.named_parameters(/*recurse=*/true))
      info.parameters.push_back(tied(describe(p.name, p.value), p.value));
    for (const auto& b : m.named_buffers(/*recurse=*/true))
      info.buffers.push_back(tied(describe(b.name, b.value), b.value));
    auto methods_of = [](const torch::jit::Module& mod, const std::string& prefix, std::vector<ts_method>& out) {
      for (const auto& meth : mod.get_methods())
        out.push_back({prefix + meth.name(), schema_text(meth.function().getSchema())});
    };
    methods_of(m, "", info.methods);
    for (const auto& nm : m.named_modules())
      if (!nm.name.empty()) methods_of(nm.value, nm.name + ".", info.submodule_methods);
    return info;
  });
}

std::vector<meta_output> run_on_meta(const std::string& path, const zip::archive& ar,
                                     const std::string& method,
                                     const std::vector<input_spec>& inputs, bool allow_code,
                                     const std::vector<arg_spec>& arg_specs) {
  torch::jit::Module m = load_on_meta(path, ar, nullptr, allow_code);
  for (const auto& in : inputs)
    for (int64_t d : in.shape)
      if (d < 0)
        throw error(errc::usage, "negative input dimension " + std::to_string(d)).with_file(path);
  std::vector<c10::IValue> tensors;
  tensors.reserve(inputs.size());
  for (const auto& in : inputs)
    tensors.emplace_back(at::empty(in.shape, at::TensorOptions().dtype(to_scalar_type(in.type)).device(c10::kMeta)));
  detail::bound_call call = [&] {
    try {
      return detail::bind_call(m, method, tensors, arg_specs);
    } catch (error& e) {
      e.with_file(path);
      throw;
    }
  }();
  detail::ensure_meta_kernels();
  return translate_errors(path, stage::run, method + " on meta inputs: ", nullptr, [&]() {
    torch::NoGradGuard no_grad;
    // The optimizing executor profiles and specializes graphs for real devices; on meta
    // inputs that is wasted work at best, so run the plain interpreter.
    torch::jit::GraphOptimizerEnabledGuard no_opt(false);
    c10::IValue result = call.method(std::move(call.args));
    std::vector<meta_output> out;
    flatten(result, "", out);
    return out;
  });
}

}  // namespace ckpt
