#include "torch/run_outputs.h"

#include <cmath>
#include <sstream>

#include <ATen/ATen.h>

namespace ckpt::detail {

void record_outputs(const c10::IValue& v, const std::string& path, materialize_report& r) {
  auto child = [&](const std::string& k) { return path.empty() ? k : path + "." + k; };
  if (v.isTensor()) {
    const at::Tensor t = v.toTensor();
    meta_output o;
    o.path = path;
    o.is_tensor = true;
    o.type = "Tensor";
    o.dtype = c10::getDtypeNames(t.scalar_type()).first;
    o.shape = t.sizes().vec();
    r.outputs.push_back(o);
    r.checksums.push_back(t.is_meta()  ? std::nan("")
                          : t.numel() ? t.to(at::kCPU).to(at::kDouble).sum().item<double>()
                                      : 0.0);
  } else if (v.isTuple() || v.isList()) {
    const auto elems = v.isTuple() ? v.toTupleRef().elements().vec() : v.toListRef().vec();
    for (size_t i = 0; i < elems.size(); ++i) record_outputs(elems[i], child(std::to_string(i)), r);
  } else if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      std::ostringstream k;
      if (e.key().isString())
        k << e.key().toStringRef();
      else
        k << e.key();
      record_outputs(e.value(), child(k.str()), r);
    }
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
}

}  // namespace ckpt::detail
