#include "formats/tensor_collector.h"

#include <algorithm>

#include "base/byteio.h"
#include "ckpt/error.h"
#include "pickle/pickle_accessors.h"

namespace ckpt::detail {
namespace {

using pickle::kind;
using pickle::value;

bool is_quantized(dtype t) {
  return t == dtype::qint8 || t == dtype::quint8 || t == dtype::qint32 || t == dtype::quint4x2 ||
         t == dtype::quint2x4;
}

dtype dtype_global(const value* v) {
  if (v->type != kind::global || v->global_module() != "torch") bad(v, "expected a torch dtype");
  auto t = dtype_from_name(v->global_attr());
  if (!t) throw_unsupported("unknown dtype torch." + std::string(v->global_attr()), v->offset);
  return *t;
}

bool is_rebuild(const value* g, std::string_view name) {
  return g && g->is_global("torch._utils", name);
}

// A tensor's object node must not have been mutated by the pickle: SETITEM(S) or APPEND(S)
// on a tensor is the shape of CVE-2026-24747 (an out-of-bounds write in weights_only).
void reject_mutation(const value* call) {
  if (object_slot_of(call, pickle::kListItems) || object_slot_of(call, pickle::kDictItems))
    bad(call, "pickle mutates a tensor with APPEND/SETITEM (CVE-2026-24747 pattern)");
}

std::string key_string(const value* k) {
  if (k->type == kind::str) return k->text;
  return pickle::repr(k, 200);
}

}  // namespace

storage_ref parse_storage_pid(const value* pid_node, bool legacy) {
  const value* pid = pid_node->items.empty() ? nullptr : pid_node->items[0];
  if (!pid || pid->type != kind::tuple || pid->items.empty() || pid->items[0]->type != kind::str ||
      pid->items[0]->text != "storage")
    bad(pid_node, "persistent id is not a ('storage', ...) tuple");
  size_t n = pid->items.size();
  if (n != 5 && !(legacy && n == 6)) bad(pid_node, "storage persistent id has " + std::to_string(n) + " fields");
  storage_ref ref;
  ref.pid_offset = pid_node->offset;
  const value* type = pid->items[1];
  if (type->type != kind::global) bad(type, "storage type must be a global");
  std::string_view cls = type->global_attr();
  if (cls == "UntypedStorage" && (type->global_module() == "torch.storage" || type->global_module() == "torch")) {
    ref.typed.reset();
  } else if (type->global_module() == "torch") {
    ref.typed = dtype_from_legacy_storage(cls);
    if (!ref.typed) throw_unsupported("unknown storage type torch." + std::string(cls), type->offset);
  } else {
    bad(type, "storage type " + type->global_name() + " is not a torch storage class");
  }
  ref.key = as_str(pid->items[2], "storage key");
  if (ref.key.empty() || ref.key.size() > 40 ||
      !std::all_of(ref.key.begin(), ref.key.end(), [](char c) { return c >= '0' && c <= '9'; }))
    bad(pid->items[2], "storage key '" + ref.key.substr(0, 40) + "' is not a decimal number");
  ref.location = as_str(pid->items[3], "storage location");
  int64_t numel = as_int(pid->items[4], "storage size");
  if (numel < 0) bad(pid->items[4], "negative storage size");
  ref.numel = uint64_t(numel);
  if (n == 6 && pid->items[5]->type != kind::none) {
    // Legacy storage views: (view_key, offset, size) into a root storage.
    const value* view = pid->items[5];
    if (view->type != kind::tuple || view->items.size() != 3) bad(view, "bad storage view metadata");
    int64_t off = as_int(view->items[1], "storage view offset");
    int64_t size = as_int(view->items[2], "storage view size");
    if (off < 0 || size < 0) bad(view, "negative storage view bounds");
    // numel stays the root storage's: the view is checked against the root's bytes.
    ref.view_offset_elements = uint64_t(off);
  }
  return ref;
}

void tensor_collector::collect(const pickle::document& doc) {
  tensor_marks_ = std::make_unique<node_marks>(doc);
  tensor_of_node_.reset();
  other_tensor_nodes_.clear();
  first_tensor_ = ckpt_.tensors.size();
  value_path path;
  walk(doc.root, path, 0);
}

const size_t* tensor_collector::tensor_of_node(const value* v) {
  if (!tensor_of_node_) {
    if (!tensor_marks_->contains(v)) return nullptr;
    // Replayed in the order they were set: records' own nodes and the others both in
    // the order of their index, the others first, as rebuild set them before try_tensor.
    tensor_of_node_ = std::make_unique<pointer_map<size_t>>(ckpt_.tensors.size());
    size_t other = 0;
    for (size_t i = first_tensor_; i <= ckpt_.tensors.size(); ++i) {
      for (; other < other_tensor_nodes_.size() && other_tensor_nodes_[other].second == i; ++other)
        tensor_of_node_->assign(other_tensor_nodes_[other].first, i);
      if (i < ckpt_.tensors.size()) tensor_of_node_->assign(ckpt_.tensors[i].node, i);
    }
    std::vector<std::pair<const value*, size_t>>().swap(other_tensor_nodes_);
  }
  return tensor_of_node_->find(v);
}

void tensor_collector::set_tensor_of_node(const value* v, size_t index, bool records_own) {
  if (tensor_of_node_) {
    tensor_of_node_->assign(v, index);
    return;
  }
  tensor_marks_->insert(v);
  if (!records_own) other_tensor_nodes_.emplace_back(v, index);
}

namespace {

// One container being walked: 16 bytes, since a walk may hold millions of them. Its
// children come in up to five sequences (sources()), each a dict (steps are its keys), a
// list (steps are indexes) or one child under a fixed name.
struct walk_frame {
  enum class seq : uint8_t { dict, list, named };
  struct source {
    seq how;
    const value* node;  // the dict or list; for `named`, the child itself
    const char* name;   // for `named`
  };
  const value* node;
  uint64_t next : 61;    // position in the current sequence
  uint64_t current : 3;  // which sequence

  static size_t sources(const value* v, source* out) {
    size_t n = 0;
    if (v->type == kind::dict) {
      out[n++] = {seq::dict, v, nullptr};
    } else if (v->type == kind::object) {
      // Opaque objects: their attributes live in the BUILD state (a dict, or the
      // (dict, slots) pair of __setstate__); container-like ones also received items.
      const value* state = v->state;
      if (state && state->type == kind::dict) {
        out[n++] = {seq::dict, state, nullptr};
      } else if (state && state->type == kind::tuple && state->items.size() == 2) {
        for (const value* part : state->items)
          if (part->type == kind::dict) out[n++] = {seq::dict, part, nullptr};
      } else if (state) {
        out[n++] = {seq::named, state, "__state__"};
      }
      if (const value* items = object_slot_of(v, pickle::kDictItems)) out[n++] = {seq::dict, items, nullptr};
      if (const value* items = object_slot_of(v, pickle::kListItems)) out[n++] = {seq::list, items, nullptr};
      if (const value* args = v->items[pickle::kArgs]; args && args->items.size() > 0)
        out[n++] = {seq::named, args, "__args__"};
    } else {
      out[n++] = {seq::list, v, nullptr};
    }
    return n;
  }

  // The next (step, child) pair, or false when every sequence is done.
  bool advance(path_element* step, const value** child) {
    source all[5];
    size_t count = sources(node, all);
    while (current < count) {
      const source& s = all[current];
      if (s.how == seq::named) {
        if (next++ > 0) {
          ++current;
          next = 0;
          continue;
        }
        *step = std::string(s.name);
        *child = s.node;
        return true;
      }
      size_t n = s.how == seq::dict ? s.node->dict_size() : s.node->items.size();
      if (next >= n) {
        ++current;
        next = 0;
        continue;
      }
      size_t i = next;
      next = next + 1;
      if (s.how == seq::list) {
        *step = int64_t(i);
        *child = s.node->items[i];
        return true;
      }
      const value* k = s.node->dict_key(i);
      if (k->type == kind::integer)
        *step = k->integer;
      else
        *step = key_string(k);
      *child = s.node->dict_value(i);
      return true;
    }
    return false;
  }
};

}  // namespace

// Iterative, with an explicit stack of frames: --max-depth may be raised far beyond what
// the C++ stack could recurse through, and the walk must stay safe whatever its value.
void tensor_collector::walk(const value* root, value_path& path, uint64_t depth) {
  std::vector<walk_frame> frames;
  // Visits `v` at `depth`; returns whether a frame was pushed for its children.
  auto visit = [&](const value* v, uint64_t d) {
    if (!v) return false;
    if (d > max_depth_)
      throw_limit("value nesting deeper than " + std::to_string(max_depth_) + " (raise with --max-depth)",
                  v->offset);
    switch (v->type) {
      case kind::dict:
      case kind::list:
      case kind::tuple:
      case kind::set:
      case kind::frozenset:
      case kind::object:
        break;
      default:
        return false;  // scalars hold no tensors
    }
    if (v->type == kind::object) {
      if (const size_t* seen = tensor_of_node(v)) {
        charge_path(path, v);
        if (paths_) ckpt_.aliases.push_back({path, *seen});
        return false;
      }
      if (try_tensor(v, path)) return false;
    }
    // A container reached twice (memo sharing, or a cycle) is walked once: its tensors keep
    // their first path, which is also what bounds the walk on "billion laughs" inputs.
    if (!visited_.insert(v, true)) return false;
    frames.push_back({v, 0, 0});
    return true;
  };
  visit(root, depth);
  const size_t base = path.size();
  path_element step;
  const value* child = nullptr;
  while (!frames.empty()) {
    walk_frame& f = frames.back();
    if (!f.advance(&step, &child)) {
      frames.pop_back();
      // Every frame but the root's was entered through a step.
      if (path.size() > base) path.pop_back();
      continue;
    }
    // Frame k (from 0) is a node at depth + k: its children are one deeper.
    uint64_t d = depth + frames.size();
    path.push_back(std::move(step));
    if (!visit(child, d)) path.pop_back();
  }
}

// Every stored path is a copy: a tensor shared many times deep down a nest (a few bytes of
// pickle per reference) would otherwise cost depth x references. One value per step, and one
// per 64 bytes of a key's text, keeps paths within the memory max_values stands for.
void tensor_collector::charge_path(const value_path& path, const value* at) {
  uint64_t cost = 0;
  for (const path_element& step : path)
    cost += 1 + (std::holds_alternative<std::string>(step) ? std::get<std::string>(step).size() / 64 : 0);
  path_values_ += cost;
  if (path_values_ > max_values_)
    throw_limit("tensor paths hold more than " + std::to_string(max_values_) +
                    " values' worth of steps (raise with --max-values)",
                at->offset);
}

bool tensor_collector::try_tensor(const value* v, value_path& path) {
  const value* fn = v->callable_global();
  if (!fn || fn->type != kind::global) return false;
  std::string_view mod = fn->global_module();
  if (mod != "torch._utils" && !(mod == "torch._tensor" && fn->global_attr() == "_rebuild_from_type_v2"))
    return false;
  std::string_view name = fn->global_attr();
  static constexpr std::string_view kTensorRebuilds[] = {
      "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
      "_rebuild_parameter_with_state", "_rebuild_meta_tensor_no_storage", "_rebuild_qtensor",
      "_rebuild_device_tensor_from_cpu_tensor", "_rebuild_from_type_v2", "_rebuild_sparse_tensor",
      "_rebuild_nested_tensor", "_rebuild_wrapper_subclass"};
  if (std::find(std::begin(kTensorRebuilds), std::end(kTensorRebuilds), name) == std::end(kTensorRebuilds))
    return false;
  if (ckpt_.tensors.size() >= max_tensors_)
    throw_limit("more than " + std::to_string(max_tensors_) + " tensors (raise with --max-tensors)", v->offset);
  tensor_record t = rebuild(v, 0);
  charge_path(path, v);
  if (paths_) t.path = path;
  size_t index = ckpt_.tensors.size();
  set_tensor_of_node(v, index, true);
  count_tensor(t);
  ckpt_.tensors.push_back(std::move(t));
  return true;
}

void tensor_collector::count_tensor(const tensor_record& r) {
  if (r.storage && *r.storage < ckpt_.storages.size()) ckpt_.storages[*r.storage].tensor_count++;
}

tensor_record tensor_collector::rebuild(const value* call, uint64_t depth) {
  if (depth > 8) bad(call, "tensor rebuild calls nested too deeply");
  if (call->type != kind::object) bad(call, "expected a tensor");
  reject_mutation(call);
  const value* fn = call->callable_global();
  if (!fn) bad(call, "expected a tensor rebuild call");
  std::string_view name = fn->global_attr();
  tensor_record t;
  t.node = call;

  if (is_rebuild(fn, "_rebuild_parameter") || is_rebuild(fn, "_rebuild_parameter_with_state")) {
    bool with_state = name == "_rebuild_parameter_with_state";
    const value* args = tuple_args(call, with_state ? 4 : 3, with_state ? 4 : 3, std::string(name).c_str());
    tensor_record inner = rebuild(arg(args, 0), depth + 1);
    set_tensor_of_node(arg(args, 0), ckpt_.tensors.size(), false);  // the data tensor is the parameter
    inner.node = call;
    inner.parameter = true;
    inner.requires_grad = as_bool(arg(args, 1), "requires_grad");
    return inner;
  }
  if (is_rebuild(fn, "_rebuild_device_tensor_from_cpu_tensor")) {
    const value* args = tuple_args(call, 4, 4, "_rebuild_device_tensor_from_cpu_tensor");
    tensor_record inner = rebuild(arg(args, 0), depth + 1);
    inner.node = call;
    inner.location = as_str(arg(args, 2), "device");
    inner.requires_grad = as_bool(arg(args, 3), "requires_grad");
    return inner;
  }
  if (fn->is_global("torch._tensor", "_rebuild_from_type_v2")) {
    // (func, new_type, args, state): a tensor subclass or a tensor with Python attributes.
    // Only the wrapped rebuild is interpreted; the subclass itself is never instantiated.
    const value* args = tuple_args(call, 4, 4, "_rebuild_from_type_v2");
    const value* inner_fn = arg(args, 0);
    const value* new_type = arg(args, 1);
    const value* inner_args = arg(args, 2);
    if (inner_fn->type != kind::global || inner_args->type != kind::tuple)
      bad(call, "_rebuild_from_type_v2: malformed arguments");
    if (inner_fn->is_global("torch._utils", "_rebuild_wrapper_subclass"))
      return wrapper_subclass(call, inner_args, arg(args, 3), depth);
    if (inner_fn->is_global("torch.nested._internal.nested_tensor", "_rebuild_njt") &&
        new_type->is_global("torch.nested._internal.nested_tensor", "NestedTensor"))
      return jagged(call, inner_args, depth);
    // Anything else builds a subclass ckptool cannot reproduce: refuse it by name.
    static constexpr std::string_view kPlainRebuilds[] = {
        "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
        "_rebuild_parameter_with_state", "_rebuild_meta_tensor_no_storage", "_rebuild_qtensor",
        "_rebuild_device_tensor_from_cpu_tensor", "_rebuild_sparse_tensor", "_rebuild_nested_tensor"};
    if (inner_fn->global_module() != "torch._utils" ||
        std::find(std::begin(kPlainRebuilds), std::end(kPlainRebuilds), inner_fn->global_attr()) ==
            std::end(kPlainRebuilds))
      throw_unsupported("tensor subclass " +
                            (new_type->type == kind::global ? new_type->global_name() : std::string("?")) +
                            " (rebuilt by " + inner_fn->global_name() + ")",
                        call->offset);
    // Evaluate func(*args) as if it were its own REDUCE node.
    pickle::value synthetic;
    synthetic.type = kind::object;
    synthetic.offset = call->offset;
    synthetic.items.assign(pickle::kObjectSlots, nullptr);
    synthetic.items[pickle::kCallable] = const_cast<value*>(inner_fn);
    synthetic.items[pickle::kArgs] = const_cast<value*>(inner_args);
    tensor_record inner = rebuild(&synthetic, depth + 1);
    inner.node = call;
    if (new_type->is_global("torch.nn.parameter", "Parameter")) inner.parameter = true;
    return inner;
  }
  if (is_rebuild(fn, "_rebuild_sparse_tensor")) return sparse(call, depth);
  if (is_rebuild(fn, "_rebuild_nested_tensor")) return nested(call, depth);
  if (is_rebuild(fn, "_rebuild_wrapper_subclass")) {
    // Called directly (not under _rebuild_from_type_v2) it makes an empty wrapper: the
    // subclass's data, if any, is nowhere in the file.
    const value* args = tuple_args(call, 8, 8, "_rebuild_wrapper_subclass");
    const value* cls = arg(args, 0);
    throw_unsupported("tensor subclass " + (cls->type == kind::global ? cls->global_name() : std::string("?")) +
                          " saved without its data",
                      call->offset);
  }
  if (is_rebuild(fn, "_rebuild_meta_tensor_no_storage")) {
    const value* args = tuple_args(call, 4, 4, "_rebuild_meta_tensor_no_storage");
    t.type = dtype_global(arg(args, 0));
    t.shape = dims(arg(args, 1), "size");
    t.stride = dims(arg(args, 2), "stride");
    t.requires_grad = as_bool(arg(args, 3), "requires_grad");
    t.location = "meta";
    if (t.shape.size() != t.stride.size()) bad(call, "size and stride have different lengths");
    for (int64_t s : t.shape)
      if (s < 0) bad(call, "negative dimension");
    (void)t.numel();  // overflow check
    return t;
  }

  const value* args;
  std::optional<dtype> v3_dtype;
  bool qtensor = false;
  if (is_rebuild(fn, "_rebuild_tensor_v2")) {
    args = tuple_args(call, 6, 7, "_rebuild_tensor_v2");
    t.requires_grad = as_bool(arg(args, 4), "requires_grad");
    if (args->items.size() == 7) tensor_bits(arg(args, 6), t);
  } else if (is_rebuild(fn, "_rebuild_tensor_v3")) {
    args = tuple_args(call, 7, 8, "_rebuild_tensor_v3");
    t.requires_grad = as_bool(arg(args, 4), "requires_grad");
    v3_dtype = dtype_global(arg(args, 6));
    if (args->items.size() == 8) tensor_bits(arg(args, 7), t);
  } else if (is_rebuild(fn, "_rebuild_tensor")) {
    args = tuple_args(call, 4, 4, "_rebuild_tensor");
  } else if (is_rebuild(fn, "_rebuild_qtensor")) {
    args = tuple_args(call, 7, 7, "_rebuild_qtensor");
    t.requires_grad = as_bool(arg(args, 5), "requires_grad");
    qtensor = true;
  } else {
    bad(call, "unexpected rebuild function " + fn->global_name());
  }
  const value* pid = arg(args, 0);
  if (pid->type != kind::persistent_id) bad(pid, "tensor storage must be a persistent id");
  storage_ref ref = parse_storage_pid(pid, legacy_);
  if (v3_dtype && ref.typed) bad(pid, "_rebuild_tensor_v3 with a typed storage");
  if (!v3_dtype && !ref.typed) bad(pid, "untyped storage without a dtype (expected _rebuild_tensor_v3)");
  t.type = v3_dtype ? *v3_dtype : *ref.typed;
  int64_t offset = as_int(arg(args, 1), "storage_offset");
  if (offset < 0) bad(arg(args, 1), "negative storage offset");
  t.shape = dims(arg(args, 2), "size");
  t.stride = dims(arg(args, 3), "stride");
  if (t.shape.size() != t.stride.size()) bad(call, "size and stride have different lengths");
  uint64_t off;
  if (!checked_add(uint64_t(offset), ref.view_offset_elements, &off) || off > uint64_t(INT64_MAX))
    bad(call, "storage offset overflows");
  t.storage_offset = int64_t(off);
  t.location = ref.location;
  const bound_storage bound = bind_(ref, t.type);
  t.storage = bound.index;
  validate_view(t, bound, ref.key, call->offset);
  if (qtensor) {
    if (!is_quantized(t.type)) bad(call, "_rebuild_qtensor of a " + std::string(info(t.type).name) + " storage");
    t.quant = std::make_shared<const quantization>(quantizer(arg(args, 4), t, depth));
  }
  return t;
}

// The rebuild's metadata dict, as torch._utils.set_tensor_metadata applies it on the CPU
// (formats.md §3.3): a "conj" or "neg" key sets that bit whatever its value (torch reads a
// dict of str to bool, so another value is refused), None or an empty dict sets nothing.
// Any other key is a custom backend's metadata, which ckptool cannot apply: unsupported.
void tensor_collector::tensor_bits(const value* metadata, tensor_record& t) {
  if (metadata->type == kind::none) return;
  if (metadata->type != kind::dict) bad(metadata, "tensor metadata must be a dict");
  for (size_t i = 0; i < metadata->dict_size(); ++i) {
    const value* k = metadata->dict_key(i);
    if (k->type != kind::str) bad(k, "tensor metadata keys must be strings");
    (void)as_bool(metadata->dict_value(i), "a tensor metadata value");
    if (k->text == "conj")
      t.conj = true;
    else if (k->text == "neg")
      t.neg = true;
    else
      throw_unsupported("tensor metadata key " + text::in_quotes(k->text) + " (a custom backend's, which ckptool cannot apply)",
                        k->offset);
  }
}

quantization tensor_collector::quantizer(const value* params, const tensor_record& t, uint64_t depth) {
  if (params->type != kind::tuple || params->items.empty())
    bad(params, "_rebuild_qtensor: quantizer_params must be a tuple");
  const value* scheme = params->items[0];
  if (scheme->type != kind::global || scheme->global_module() != "torch")
    bad(scheme, "_rebuild_qtensor: expected a torch.qscheme");
  quantization q;
  q.scheme = std::string(scheme->global_attr());
  if (q.scheme == "per_tensor_affine") {
    if (params->items.size() != 3) bad(params, "per_tensor_affine takes (qscheme, scale, zero_point)");
    q.scale = as_number(params->items[1], "scale");
    q.zero_point = as_int(params->items[2], "zero_point");
    return q;
  }
  if (q.scheme != "per_channel_affine" && q.scheme != "per_channel_affine_float_qparams")
    throw_unsupported("quantization scheme torch." + q.scheme, scheme->offset);
  if (params->items.size() != 4) bad(params, q.scheme + " takes (qscheme, scales, zero_points, axis)");
  q.axis = as_int(params->items[3], "axis");
  if (q.axis < 0 || q.axis >= int64_t(t.shape.size()))
    bad(params->items[3], "axis " + std::to_string(q.axis) + " of a " + std::to_string(t.shape.size()) +
                              "-dimensional quantized tensor");
  channel_values(params->items[1], t, q.axis, depth, false, q);
  channel_values(params->items[2], t, q.axis, depth, true, q);
  // torch.load converts the pair only when both are lists.
  if (bool(q.scales) != bool(q.zero_points))
    bad(params, q.scheme + ": scales and zero_points must both be tensors or both be lists");
  return q;
}

void tensor_collector::channel_values(const value* v, const tensor_record& t, int64_t axis, uint64_t depth,
                                      bool zero_points, quantization& q) {
  const char* what = zero_points ? "zero_points" : "scales";
  const uint64_t channels = uint64_t(t.shape[size_t(axis)]);
  if (v->type == kind::list) {
    if (v->items.size() != channels)
      bad(v, std::to_string(v->items.size()) + " " + what + " for " + std::to_string(channels) + " channels");
    auto& out = zero_points ? q.zero_point_list : q.scale_list;
    for (const value* e : v->items) out.push_back(as_number(e, what));
    return;
  }
  tensor_record r = rebuild(v, depth + 1);
  if (r.quant || !r.storage) bad(v, std::string(what) + " must be a plain tensor with data");
  // torch.save names every per-channel tensor per_channel_affine; LibTorch tells the float
  // variant by the zero points' dtype, and checks the dtypes itself when it builds it.
  if (r.shape.size() != 1 || uint64_t(r.shape[0]) != channels)
    bad(v, std::string(what) + " must be one value per channel (" + std::to_string(channels) + ")");
  count_tensor(r);
  (zero_points ? q.zero_points : q.scales) = std::make_shared<const tensor_record>(std::move(r));
}

std::vector<int64_t> tensor_collector::dims(const value* v, const char* what) {
  // torch.Size pickles as a tuple; TorchScript writes MARK ... TUPLE; both are tuples here.
  if (v->type != kind::tuple && v->type != kind::list) bad(v, std::string(what) + " must be a tuple");
  // torch.load reads any rank. Memory is what needs a bound: one memoized 10^6-element tuple
  // can be the size of many tensors, so the entries past 64 per tuple share one budget.
  if (v->items.size() > 64) {
    uint64_t extra = v->items.size() - 64;
    if (extra > kDimsPast64Budget - dims_past_64_)
      throw_limit("tensor " + std::string(what) + "s with more than 64 dimensions hold more than " +
                      std::to_string(kDimsPast64Budget) + " dimensions past the 64th in total",
                  v->offset);
    dims_past_64_ += extra;
  }
  return as_int_tuple(v, what);
}

void tensor_collector::validate_view(const tensor_record& t, const bound_storage& s, const std::string& key,
                                     uint64_t offset) const {
  // CVE-2026-24747 class: a view must lie inside its storage, computed without overflow.
  uint64_t numel = 1;
  uint64_t max_index = uint64_t(t.storage_offset);
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (t.shape[i] < 0) throw_corrupt("negative dimension in tensor shape", offset);
    if (t.stride[i] < 0) throw_unsupported("negative stride in tensor view", offset);
    if (!checked_mul(numel, uint64_t(t.shape[i]), &numel))
      throw_corrupt("tensor element count overflows", offset);
  }
  if (numel == 0) return;
  for (size_t i = 0; i < t.shape.size(); ++i) {
    uint64_t span;
    if (!checked_mul(uint64_t(t.shape[i] - 1), uint64_t(t.stride[i]), &span) ||
        !checked_add(max_index, span, &max_index))
      throw_corrupt("tensor view extent overflows", offset);
  }
  uint64_t end_bytes;
  if (!checked_add(max_index, 1, &end_bytes) || !checked_mul(end_bytes, element_size(t.type), &end_bytes))
    throw_corrupt("tensor view extent overflows", offset);
  const uint32_t per_byte = elements_per_byte(t.type);
  if (per_byte > 1) end_bytes = end_bytes / per_byte + (end_bytes % per_byte != 0);
  if (end_bytes > s.nbytes)
    throw_corrupt("tensor view needs " + std::to_string(end_bytes) + " bytes of storage '" + key +
                      "', which has " + std::to_string(s.nbytes),
                  offset);
}

tensor_collector::binder zip_storage_binder(checkpoint& ckpt, uint32_t file, std::string record_dir, bool records,
                                            size_t first_index) {
  // The storage made for each zip entry, by entry index: a storage shared by many tensors
  // is found again without building or hashing its record name once more. Without records,
  // the entry's bound storage type is kept beside it (its size is the entry's, checked).
  constexpr size_t kNone = ~size_t(0);
  struct state {
    std::string record_dir;
    std::string id;  // reused: one allocation for every lookup
    std::vector<size_t> storage_of_entry;
    std::vector<dtype> type_of_entry;  // without records
    std::vector<bool> untyped_entry;   // first bound by an UntypedStorage reference
    size_t next_entry = 0;  // the entry after the last one found
    size_t next_index = 0;  // without records: the index the next storage's record would have
  };
  auto st = std::make_shared<state>();
  st->record_dir = std::move(record_dir);
  const zip::archive& ar = *ckpt.files.at(file).zip;
  st->storage_of_entry.assign(ar.entries().size(), kNone);
  st->untyped_entry.assign(ar.entries().size(), false);
  if (!records) st->type_of_entry.assign(ar.entries().size(), dtype::uint8);
  st->next_index = first_index;
  return [&ckpt, &ar, file, st, records](const storage_ref& ref, dtype element_type) -> bound_storage {
    uint64_t nbytes;
    dtype storage_type = ref.typed ? *ref.typed : element_type;
    if (!checked_mul(ref.numel, ref.typed ? element_size(*ref.typed) : 1, &nbytes))
      throw_corrupt("storage size overflows", ref.pid_offset);
    st->id.assign(st->record_dir).append(ref.key);
    // torch.save writes the storages' records in the order its pickle first names them
    // (formats.md §2.2), so the entry after the last one found is tried first: entry names
    // are unique, so a match is the entry find() would give, without a million hash probes.
    const auto& entries = ar.entries();
    const zip::entry* e = st->next_entry < entries.size() && entries[st->next_entry].record == st->id
                              ? &entries[st->next_entry]
                              : ar.find(st->id);
    if (e) st->next_entry = size_t(e - entries.data()) + 1;
    if (!e) throw_corrupt("storage '" + ref.key + "' has no record " + st->id + " in the archive", ref.pid_offset);
    const size_t entry = size_t(e - entries.data());
    size_t& bound = st->storage_of_entry[entry];
    if (bound != kNone) {
      const dtype bound_type = records ? ckpt.storages[bound].type : st->type_of_entry[entry];
      const uint64_t bound_bytes = records ? ckpt.storages[bound].nbytes : e->uncompressed_size;
      // torch.load hands every later reference the storage loaded first (formats.md §2.2).
      // An UntypedStorage one (_rebuild_tensor_v3, which gives the tensor its own dtype:
      // torch.save writes a float8 view of uint8 bytes so) needs only the same bytes; a
      // typed one (_rebuild_tensor_v2, whose tensor takes the storage's dtype) the same
      // type too, and after an untyped first reference that type is torch's for it, uint8.
      const bool agrees =
          bound_bytes == nbytes &&
          (!ref.typed || (st->untyped_entry[entry] ? storage_type == dtype::uint8 : bound_type == storage_type));
      if (!agrees)
        throw_corrupt("storage '" + ref.key + "' reused as " + name(storage_type) + " x " +
                          std::to_string(ref.numel) + " after " + name(bound_type) + " (" +
                          std::to_string(bound_bytes) + " bytes)",
                      ref.pid_offset);
      return {bound, bound_bytes};
    }
    if (e->method != 0)
      throw_unsupported("tensor record " + std::string(e->name) + " is compressed; torch writes them stored",
                        e->local_header_offset);
    if (e->uncompressed_size != nbytes)
      throw_corrupt("record " + std::string(e->name) + " holds " + std::to_string(e->uncompressed_size) +
                        " bytes but its storage declares " + std::to_string(nbytes),
                    e->local_header_offset);
    st->untyped_entry[entry] = !ref.typed;
    if (!records) {
      bound = st->next_index++;
      st->type_of_entry[entry] = storage_type;
      return {bound, nbytes};
    }
    storage_record s;
    s.key = ref.key;
    s.type = storage_type;
    s.nbytes = nbytes;
    s.location = ref.location;
    s.record = e;
    s.file_offset = e->data_offset;
    s.crc32 = e->crc32;
    s.file = file;
    ckpt.storages.push_back(std::move(s));
    bound = ckpt.storages.size() - 1;
    return {bound, nbytes};
  };
}

}  // namespace ckpt::detail
