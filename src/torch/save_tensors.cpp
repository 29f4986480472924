// save_tensors: a torch.save archive written with ckptool's own pickle and zip writers, in
// the layout torch.save itself produces (formats.md §2.2): data.pkl holding an
// OrderedDict of _rebuild_tensor_v2 calls (v3 with UntypedStorage for dtypes that have no
// typed storage class), .format_version, .storage_alignment, byteorder, data/0..n-1 in
// key order, version.
#include <functional>
#include <map>
#include <unordered_map>

#include "torch/aten_types.h"
#include "ckpt/error.h"
#include "ckpt/load.h"
#include "ckpt/output_set.h"
#include "ckpt/pickle_writer.h"
#include "ckpt/zip_writer.h"
#include "pickle/pickle_builder.h"

namespace ckpt {
namespace {

using pickle::kind;
using pickle::value;
using builder = pickle::builder;

struct storage_out {
  at::Storage storage;
  dtype type;
  std::string key;
};

void write_archive(output_file& out, const std::vector<uint8_t>& pkl, const std::vector<storage_out>& storages) {
  zip::writer w(out.fd(), "archive");
  w.add_record("data.pkl", pkl);
  w.add_record(".format_version", "1", 1);
  w.add_record(".storage_alignment", "64", 2);
  w.add_record("byteorder", "little", 6);
  for (const auto& s : storages) {
    uint64_t nbytes = s.storage.nbytes();
    w.begin_record("data/" + s.key, nbytes);
    if (nbytes) {
      at::Tensor bytes = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(s.storage.device()))
                             .set_(s.storage, 0, {int64_t(nbytes)}, {1});
      // Device storages come back to the host one at a time: host memory stays bounded by
      // the largest storage, not the checkpoint.
      if (!bytes.is_cpu()) bytes = bytes.cpu();
      w.write(bytes.data_ptr<uint8_t>(), size_t(nbytes));
    }
    w.end_record();
  }
  w.add_record("version", "3\n", 2);
  w.finish();
}

}  // namespace

void save_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors, output_file& out) {
  save_tensors(tensors, std::vector<tensor_state>(tensors.size()), out);
}

void save_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  const std::vector<tensor_state>& states, output_file& out) {
  if (states.size() != tensors.size()) throw error(errc::usage, "save_tensors: one state per tensor expected");
  builder b;
  value* root = b.ordered_dict();
  b.doc.root = root;

  // One record per distinct storage, numbered in the order first met, as torch.save does.
  std::vector<storage_out> storages;
  std::unordered_map<const void*, size_t> index_of;
  // The rebuild call torch.save writes for t; quantized tensors carry their quantizer, whose
  // per-channel scales and zero points are tensors with storages of their own.
  std::function<value*(const at::Tensor&, const std::string&, bool)> rebuild =
      [&](const at::Tensor& t0, const std::string& name, bool requires_grad) -> value* {
    at::Tensor t = t0.is_meta() ? t0 : t0.detach();
    if (t.layout() != at::kStrided) {
      // As Tensor.__reduce_ex__: _rebuild_sparse_tensor(layout, (parts..., size[, coalesced])),
      // the parts pickled as tensors of their own.
      const bool coo = t.layout() == at::kSparse;
      const bool rows = t.layout() == at::kSparseCsr || t.layout() == at::kSparseBsr;
      if (!coo && !rows && t.layout() != at::kSparseCsc && t.layout() != at::kSparseBsc)
        throw error(errc::unsupported, "tensor " + name + ": layout " + c10::str(t.layout()) + " cannot be saved");
      std::string layout_name = "torch.sparse_" + std::string(coo ? "coo"
                                                                : t.layout() == at::kSparseCsr ? "csr"
                                                                : t.layout() == at::kSparseCsc ? "csc"
                                                                : t.layout() == at::kSparseBsr ? "bsr"
                                                                                                : "bsc");
      value* layout = b.call(b.global("torch.serialization", "_get_layout"), b.tuple({b.str(layout_name)}));
      value* size = b.call(b.global("torch", "Size"), b.tuple({b.ints(t.sizes())}));
      value* data;
      if (coo)
        data = b.tuple({rebuild(t._indices(), name + " indices", false), rebuild(t._values(), name + " values", false),
                        size, b.boolean(t.is_coalesced())});
      else
        data = b.tuple({rebuild(rows ? t.crow_indices() : t.ccol_indices(), name + " compressed indices", false),
                        rebuild(rows ? t.col_indices() : t.row_indices(), name + " plain indices", false),
                        rebuild(t.values(), name + " values", false), size});
      return b.call(b.global("torch._utils", "_rebuild_sparse_tensor"), b.tuple({layout, data}));
    }
    dtype dt = detail::from_scalar_type(t.scalar_type());
    const dtype_info& di = info(dt);
    if (t.is_meta())
      return b.call(b.global("torch._utils", "_rebuild_meta_tensor_no_storage"),
                    b.tuple({b.global("torch", di.name), b.ints(t.sizes()), b.ints(t.strides()), b.boolean(requires_grad)}));
    const void* id = t.storage().unsafeGetStorageImpl();
    auto [it, fresh] = index_of.emplace(id, storages.size());
    if (fresh) storages.push_back({t.storage(), dt, std::to_string(storages.size())});
    const storage_out& s = storages[it->second];
    // torch.save's rule (formats.md §3.2): views of one storage agree on the dtype the
    // storage is pickled as, uint8 for a dtype without a legacy storage class (pickled
    // untyped). A float8 view of uint8 bytes is fine; an int32 view of int16 is not.
    const auto pickled_as = [](dtype d) { return info(d).legacy_storage ? d : dtype::uint8; };
    if (pickled_as(s.type) != pickled_as(dt))
      throw error(errc::unsupported, "tensors " + name + " and another share a storage with different dtypes; torch.save refuses that too");
    bool typed = di.legacy_storage != nullptr;
    uint64_t nbytes = s.storage.nbytes();
    value* pid_tuple = b.tuple({b.str("storage"),
                                typed ? b.global("torch", di.legacy_storage) : b.global("torch.storage", "UntypedStorage"),
                                b.str(s.key), b.str("cpu"),
                                b.integer(int64_t(typed ? nbytes / di.element_size : nbytes))});
    value* pid = b.doc.make(kind::persistent_id, 0);
    pid->items = {pid_tuple};
    value* offset = b.integer(t.storage_offset());
    if (t.is_quantized()) {
      const std::string scheme = c10::toString(t.qscheme());
      value* params;
      if (t.qscheme() == at::kPerTensorAffine) {
        params = b.tuple({b.global("torch", scheme), b.floating(t.q_scale()), b.integer(t.q_zero_point())});
      } else if (t.qscheme() == at::kPerChannelAffine || t.qscheme() == at::kPerChannelAffineFloatQParams) {
        // As torch.save: per_channel_affine for the float-qparams variant too (torch.load
        // tells them apart by the zero points' dtype).
        params = b.tuple({b.global("torch", "per_channel_affine"), rebuild(t.q_per_channel_scales(), name + " scales", false),
                          rebuild(t.q_per_channel_zero_points(), name + " zero points", false),
                          b.integer(t.q_per_channel_axis())});
      } else {
        throw error(errc::unsupported, "tensor " + name + ": quantization scheme " + scheme + " cannot be saved");
      }
      return b.call(b.global("torch._utils", "_rebuild_qtensor"),
                    b.tuple({pid, offset, b.ints(t.sizes()), b.ints(t.strides()), params, b.boolean(requires_grad),
                             b.ordered_dict()}));
    }
    // _rebuild_tensor_v3 sets the dtype of a tensor it has already made require grad, an
    // in-place change torch.load fails on: such a file could not be read back.
    if (!typed && requires_grad)
      throw error(errc::unsupported, "tensor " + name + ": a " + di.name +
                                         " tensor that requires grad (not a Parameter): torch.load cannot rebuild one");
    std::vector<value*> args = {pid, offset, b.ints(t.sizes()), b.ints(t.strides()), b.boolean(requires_grad), b.ordered_dict()};
    if (!typed) args.push_back(b.global("torch", di.name));
    // As Tensor.__reduce_ex__: the conjugate and negative bits in a metadata dict, last.
    if (t.is_conj() || t.is_neg()) {
      value* bits = b.doc.make(kind::dict, 0);
      if (t.is_conj()) bits->items.insert(bits->items.end(), {b.str("conj"), b.boolean(true)});
      if (t.is_neg()) bits->items.insert(bits->items.end(), {b.str("neg"), b.boolean(true)});
      args.push_back(bits);
    }
    return b.call(b.global("torch._utils", typed ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3"), b.tuple(args));
  };
  // As torch.save: a Parameter is _rebuild_parameter around its data (saved with
  // requires_grad false), and one tensor object under several names is pickled once, so
  // torch.load gives back one object (tied parameters stay one Parameter).
  std::map<std::pair<const void*, bool>, value*> pickled;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    // torch.load refuses requires_grad on an integer tensor: a file claiming it is not repeated.
    const bool grad = states[i].requires_grad && (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()));
    const tensor_state st{states[i].parameter, grad, states[i].python_state};
    value*& v = pickled[{t.unsafeGetTensorImpl(), st.parameter}];
    if (!v) {
      v = rebuild(t, name, st.requires_grad && !st.parameter);
      // Python attributes (plain values, checked by tensor_states) are the input's own
      // pickle nodes: the writer walks them like its own.
      value* attrs = const_cast<value*>(st.python_state);
      if (st.parameter && attrs)
        v = b.call(b.global("torch._utils", "_rebuild_parameter_with_state"),
                   b.tuple({v, b.boolean(st.requires_grad), b.ordered_dict(), attrs}));
      else if (st.parameter)
        v = b.call(b.global("torch._utils", "_rebuild_parameter"),
                   b.tuple({v, b.boolean(st.requires_grad), b.ordered_dict()}));
      else if (attrs)
        v = b.call(b.global("torch._tensor", "_rebuild_from_type_v2"),
                   b.tuple({v->items[pickle::kCallable], b.global("torch", "Tensor"), v->items[pickle::kArgs], attrs}));
    }
    root->items.push_back(b.str(name));
    root->items.push_back(v);
  }

  std::vector<uint8_t> pkl = pickle::write(b.doc.root, 2, &b.doc);
  try {
    write_archive(out, pkl, storages);
  } catch (error& e) {
    e.with_file(out.path());  // a full disk is OUT's, not the checkpoint's
    throw;
  }
}

void save_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors, const std::string& path) {
  output_set set;
  output_file& out = set.add_output(path);
  set.open();
  save_tensors(tensors, out);
  set.commit();
}

}  // namespace ckpt
