// Tensors that torch.save writes as something other than one strided view: sparse
// layouts (_rebuild_sparse_tensor), strided nested tensors (_rebuild_nested_tensor), jagged
// nested tensors (NestedTensor.__reduce_ex__) and DTensors (_rebuild_wrapper_subclass under
// _rebuild_from_type_v2). Each becomes one tensor record whose `kind` names what it is and
// holds its parts; none is ever taken apart into unrelated tensors (docs/tensor-kinds.md).
#include <algorithm>

#include "ckpt/error.h"
#include "pickle/pickle_accessors.h"
#include "formats/tensor_collector.h"

namespace ckpt::detail {
namespace {

using pickle::kind;
using pickle::value;

// torch.Size(tuple) as torch.save writes it, or a plain tuple.
std::vector<int64_t> size_value(const value* v) {
  if (v->type == kind::object) {
    const value* fn = v->callable_global();
    const value* args = v->items[pickle::kArgs];
    if (!fn || !fn->is_global("torch", "Size") || !args || args->type != kind::tuple || args->items.size() != 1)
      bad(v, "sparse tensor size must be a torch.Size");
    v = args->items[0];
  }
  if (v->type != kind::tuple && v->type != kind::list) bad(v, "sparse tensor size must be a tuple");
  if (v->items.size() > 64) throw_unsupported("sparse tensor with more than 64 dimensions", v->offset);
  std::vector<int64_t> out;
  for (const value* e : v->items) {
    int64_t d = as_int(e, "sparse tensor size");
    if (d < 0) bad(e, "negative dimension in sparse tensor size");
    out.push_back(d);
  }
  return out;
}

// torch.serialization._get_layout('torch.sparse_csr') (torch >= 1.13), or the layout object
// pickled as the global torch.sparse_csr by older writers.
std::string layout_name(const value* v) {
  if (v->type == kind::global && v->global_module() == "torch") return std::string(v->global_attr());
  if (v->type == kind::object) {
    const value* fn = v->callable_global();
    const value* args = v->items[pickle::kArgs];
    if (fn && fn->is_global("torch.serialization", "_get_layout") && args && args->type == kind::tuple &&
        args->items.size() == 1 && args->items[0]->type == kind::str) {
      const std::string& text = args->items[0]->text;
      if (text.compare(0, 6, "torch.") == 0) return text.substr(6);
    }
  }
  bad(v, "expected a torch layout");
}

bool is_index_type(dtype t) { return t == dtype::int64 || t == dtype::int32; }

const value* member(const value* state, std::string_view key) {
  if (!state) return nullptr;
  // An object's BUILD state is its __dict__, or a (__dict__ or None, slots dict) pair
  // (DTensor keeps _local_tensor and _spec in slots).
  if (state->type == kind::tuple && state->items.size() == 2) {
    const value* found = member(state->items[0], key);
    return found ? found : member(state->items[1], key);
  }
  return detail::str_key(state, key);
}


const value* object_state(const value* v) { return v && v->type == kind::object ? v->state : nullptr; }

// Shard(dim=0), Replicate(), Partial(sum), _StridedShard(dim=0, split_factor=2).
std::string placement_text(const value* p) {
  const value* cls = p->type == kind::object ? p->callable_global() : nullptr;
  if (!cls) bad(p, "DTensor placement must be an object");
  std::string out(cls->global_attr());
  out += '(';
  if (const value* st = object_state(p)) {
    bool first = true;
    for (size_t i = 0; st->type == kind::dict && i < st->dict_size(); ++i) {
      const value* k = st->dict_key(i);
      const value* v = st->dict_value(i);
      if (k->type != kind::str) continue;
      std::string shown;
      if (v->type == kind::integer)
        shown = std::to_string(v->integer);
      else if (v->type == kind::str)
        shown = v->text;
      else
        continue;
      out += (first ? "" : ", ") + (cls->global_attr() == "Partial" && k->text == "reduce_op" ? shown : k->text + "=" + shown);
      first = false;
    }
  }
  return out + ')';
}

}  // namespace

std::shared_ptr<const tensor_record> tensor_collector::component(const value* v, uint64_t depth, const std::string& what) {
  tensor_record r = rebuild(v, depth + 1);
  if (!r.storage || r.quant || r.kind) bad(v, what + " must be a plain tensor with data");
  count_tensor(r);
  return std::make_shared<const tensor_record>(std::move(r));
}

tensor_record tensor_collector::sparse(const value* call, uint64_t depth) {
  const value* args = tuple_args(call, 2, 2, "_rebuild_sparse_tensor");
  auto k = std::make_shared<tensor_kind>();
  k->layout = layout_name(args->items[0]);
  const value* data = args->items[1];
  if (data->type != kind::tuple) bad(data, "_rebuild_sparse_tensor: data must be a tuple");
  tensor_record t;
  t.node = call;
  if (k->layout == "sparse_coo") {
    if (data->items.size() != 3 && data->items.size() != 4) bad(data, "sparse COO data must be (indices, values, size[, is_coalesced])");
    auto indices = component(data->items[0], depth, "sparse COO indices");
    auto values = component(data->items[1], depth, "sparse COO values");
    t.shape = size_value(data->items[2]);
    if (data->items.size() == 4 && data->items[3]->type != kind::none) {
      if (data->items[3]->type != kind::boolean) bad(data->items[3], "is_coalesced must be a bool");
      k->coalesced = data->items[3]->flag;
    }
    // What torch.sparse_coo_tensor checks before it builds anything: the rest (index
    // bounds) needs the data and is LibTorch's to check when the tensor is made.
    if (indices->type != dtype::int64 || indices->shape.size() != 2) bad(call, "sparse COO indices must be a 2-D int64 tensor");
    const int64_t sparse_dims = indices->shape[0], nnz = indices->shape[1];
    if (values->shape.empty() || values->shape[0] != nnz)
      bad(call, "sparse COO values must have one row per index column (" + std::to_string(nnz) + ")");
    const size_t dense_dims = values->shape.size() - 1;
    if (t.shape.size() != size_t(sparse_dims) + dense_dims ||
        !std::equal(values->shape.begin() + 1, values->shape.end(), t.shape.begin() + sparse_dims))
      bad(call, "sparse COO size does not match its indices and values");
    k->components = {{"indices", indices}, {"values", values}};
  } else if (k->layout == "sparse_csr" || k->layout == "sparse_csc" || k->layout == "sparse_bsr" ||
             k->layout == "sparse_bsc") {
    if (data->items.size() != 4) bad(data, "sparse compressed data must be (compressed_indices, plain_indices, values, size)");
    const bool rows = k->layout == "sparse_csr" || k->layout == "sparse_bsr";
    const bool blocked = k->layout == "sparse_bsr" || k->layout == "sparse_bsc";
    auto compressed = component(data->items[0], depth, rows ? "crow_indices" : "ccol_indices");
    auto plain = component(data->items[1], depth, rows ? "col_indices" : "row_indices");
    auto values = component(data->items[2], depth, "sparse values");
    t.shape = size_value(data->items[3]);
    if (!is_index_type(compressed->type) || compressed->type != plain->type)
      bad(call, "sparse compressed indices must both be int32 or both int64");
    const size_t batch = compressed->shape.empty() ? 0 : compressed->shape.size() - 1;
    if (compressed->shape.empty() || plain->shape.size() != batch + 1 ||
        !std::equal(compressed->shape.begin(), compressed->shape.end() - 1, plain->shape.begin()))
      bad(call, "sparse compressed indices have mismatched batch dimensions");
    const int64_t nnz = plain->shape.back();
    const size_t block_dims = blocked ? 2 : 0;
    if (values->shape.size() < batch + 1 + block_dims || values->shape[batch] != nnz)
      bad(call, "sparse values must have one entry per plain index (" + std::to_string(nnz) + ")");
    const size_t dense = values->shape.size() - batch - 1 - block_dims;
    if (t.shape.size() != batch + 2 + dense) bad(call, "sparse compressed size does not match its indices and values");
    k->components = {{rows ? "crow_indices" : "ccol_indices", compressed},
                     {rows ? "col_indices" : "row_indices", plain},
                     {"values", values}};
  } else {
    throw_unsupported("sparse layout torch." + k->layout, uint64_t(args->items[0]->offset));
  }
  const tensor_record& values = *k->components.back().second;
  t.type = values.type;
  t.location = values.location;
  t.kind = std::move(k);
  return t;
}

tensor_record tensor_collector::nested(const value* call, uint64_t depth) {
  const value* args = tuple_args(call, 4, 4, "_rebuild_nested_tensor");
  auto k = std::make_shared<tensor_kind>();
  k->layout = "nested";
  auto buffer = component(args->items[0], depth, "nested tensor buffer");
  auto sizes = component(args->items[1], depth, "nested tensor sizes");
  auto strides = component(args->items[2], depth, "nested tensor strides");
  auto offsets = component(args->items[3], depth, "nested tensor offsets");
  if (buffer->shape.size() != 1) bad(call, "nested tensor buffer must be 1-D");
  if (sizes->type != dtype::int64 || strides->type != dtype::int64 || offsets->type != dtype::int64)
    bad(call, "nested tensor sizes, strides and offsets must be int64");
  // A nested tensor of n tensors has an n x dim sizes matrix (n x 0 when they are scalars;
  // LibTorch writes an empty 1-D one for n = 0).
  const int64_t n = sizes->shape.empty() ? 0 : sizes->shape[0];
  const int64_t dims = sizes->shape.size() == 2 ? sizes->shape[1] : 0;
  if (sizes->shape.size() > 2 || strides->shape != sizes->shape || offsets->shape.size() != 1 ||
      offsets->shape[0] != n)
    bad(call, "nested tensor sizes, strides and offsets disagree on the number of tensors");
  tensor_record t;
  t.node = call;
  t.type = buffer->type;
  t.location = buffer->location;
  t.shape.assign(size_t(dims) + 1, -1);
  t.shape[0] = n;
  k->components = {{"buffer", buffer}, {"sizes", sizes}, {"strides", strides}, {"storage_offsets", offsets}};
  t.kind = std::move(k);
  return t;
}

tensor_record tensor_collector::jagged(const value* call, const value* njt_args, uint64_t depth) {
  const value* kwargs = njt_args->items.size() == 1 ? njt_args->items[0] : nullptr;
  if (!kwargs || kwargs->type != kind::dict) bad(call, "_rebuild_njt: expected one dict of arguments");
  auto k = std::make_shared<tensor_kind>();
  k->layout = "jagged";
  const value* values_node = member(kwargs, "values");
  const value* offsets_node = member(kwargs, "offsets");
  if (!values_node || !offsets_node) bad(call, "_rebuild_njt: values and offsets are required");
  auto values = component(values_node, depth, "jagged values");
  auto offsets = component(offsets_node, depth, "jagged offsets");
  k->components = {{"values", values}, {"offsets", offsets}};
  if (const value* lengths = member(kwargs, "lengths"); lengths && lengths->type != kind::none)
    k->components.emplace_back("lengths", component(lengths, depth, "jagged lengths"));
  // min/max sequence lengths are cached as (empty) tensors whose shape is the value.
  if (const value* cache = member(kwargs, "_metadata_cache"); cache && cache->type == kind::dict)
    for (size_t i = 0; i < cache->dict_size(); ++i)
      if (cache->dict_key(i)->type == kind::str && cache->dict_value(i)->type == kind::object)
        k->components.emplace_back(cache->dict_key(i)->text, component(cache->dict_value(i), depth, "jagged metadata"));
  k->ragged_dim = 1;
  if (const value* r = member(kwargs, "_ragged_idx")) k->ragged_dim = as_int(r, "_ragged_idx");
  if (values->shape.empty() || offsets->shape.size() != 1 || offsets->shape[0] < 1)
    bad(call, "jagged nested tensor needs values of at least 1 dimension and 1-D offsets");
  const int64_t ndim = int64_t(values->shape.size()) + 1;
  if (k->ragged_dim < 1 || k->ragged_dim >= ndim) bad(call, "jagged nested tensor: ragged dimension out of range");
  tensor_record t;
  t.node = call;
  t.type = values->type;
  t.location = values->location;
  if (const value* rg = member(kwargs, "requires_grad"); rg && rg->type == kind::boolean) t.requires_grad = rg->flag;
  // [batch, ..., ragged (-1), ...]: values' dimension 0 is the ragged one, flattened.
  t.shape.push_back(offsets->shape[0] - 1);
  for (int64_t d = 1; d < ndim; ++d)
    t.shape.push_back(d == k->ragged_dim ? -1 : values->shape[size_t(d < k->ragged_dim ? d : d - 1)]);
  t.kind = std::move(k);
  return t;
}

tensor_record tensor_collector::wrapper_subclass(const value* call, const value* wrapper_args, const value* state,
                                                 uint64_t depth) {
  if (wrapper_args->items.size() != 8) bad(call, "_rebuild_wrapper_subclass: expected 8 arguments");
  const value* cls = wrapper_args->items[0];
  const std::string cls_name = cls->type == kind::global ? cls->global_name() : "?";
  const bool dtensor = cls_name == "torch.distributed.tensor.DTensor" ||
                       cls_name == "torch.distributed.tensor._api.DTensor" ||
                       cls_name == "torch.distributed._tensor.api.DTensor";
  if (!dtensor) throw_unsupported("tensor subclass " + cls_name, uint64_t(call->offset));
  const value* local = member(state, "_local_tensor");
  const value* spec = member(state, "_spec");
  if (!local || !spec) bad(call, "DTensor without _local_tensor and _spec");
  tensor_record t = rebuild(local, depth + 1);
  if (t.kind || t.quant || !t.storage)
    throw_unsupported("DTensor whose local tensor is not a plain tensor with data", uint64_t(local->offset));
  t.node = call;
  auto k = std::make_shared<tensor_kind>();
  k->subclass = "torch.distributed.tensor.DTensor";
  for (const value* d : wrapper_args->items[2]->items) k->global_shape.push_back(as_int(d, "DTensor size"));
  const value* rg = wrapper_args->items[7];
  if (rg->type == kind::boolean) t.requires_grad = rg->flag;
  const value* spec_state = object_state(spec);
  const value* mesh_state = object_state(member(spec_state, "mesh"));
  // torch >= 2.9 keeps the mesh's shape in _layout and its ranks in _rank_map; older ones
  // in the `mesh` tensor itself.
  if (const value* layout_state = object_state(member(mesh_state, "_layout")))
    if (const value* shape = member(layout_state, "shape"); shape && shape->type == kind::tuple)
      for (const value* d : shape->items) k->mesh_shape.push_back(as_int(d, "mesh shape"));
  for (const char* name : {"_rank_map", "mesh"})
    if (const value* m = member(mesh_state, name); m && m->type == kind::object) {
      auto ranks = component(m, depth, std::string("device mesh ") + name);
      if (k->mesh_shape.empty() && std::string_view(name) == "mesh") k->mesh_shape = ranks->shape;
      k->components.emplace_back(name, std::move(ranks));
    }
  if (const value* names = member(mesh_state, "_mesh_dim_names"); names && names->type == kind::tuple)
    for (const value* n : names->items)
      if (n->type == kind::str) k->mesh_dim_names.push_back(n->text);
  if (const value* placements = member(spec_state, "placements");
      placements && (placements->type == kind::tuple || placements->type == kind::list))
    for (const value* p : placements->items) k->placements.push_back(placement_text(p));
  t.kind = std::move(k);
  return t;
}

}  // namespace ckpt::detail
