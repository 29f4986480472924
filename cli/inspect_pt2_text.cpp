// The torch.export part of `ckptool inspect`'s text: each model's versions, calling
// convention, signature with symbolic dims and their ranges, what is listed but not read,
// and with --graph every node's output shapes. Every string from the file is escaped.
#include <iomanip>
#include <map>

#include "base/text_escape.h"
#include "ckpt/pt2.h"
#include "common.h"
#include "inspect_text.h"

namespace cli {
namespace {

using ckpt::display_name;
using ckpt::escape_controls;

std::string dims_text(const std::vector<ckpt::pt2::dim>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + escape_controls(dims[i].text());
  return out + "]";
}

std::string value_text(const ckpt::pt2::value& v) {
  if (v.has_meta) return v.dtype + " " + dims_text(v.shape) + (v.device != "cpu" ? " on " + escape_controls(v.device) : "");
  std::string out = escape_controls(v.kind);
  if (!v.text.empty()) out += " " + escape_controls(v.text);
  return out;
}

void print_signature(std::ostream& out, const char* title, const std::vector<ckpt::pt2::signature_entry>& specs,
                     const char* user_role) {
  size_t w = 4;
  for (const auto& e : specs)
    if (e.role == user_role) w = std::max(w, display_name(e.arg.name).size());
  out << "  " << title << ":\n";
  std::map<std::string, size_t> others;
  for (const auto& e : specs) {
    if (e.role != user_role) {
      ++others[e.role + (e.persistent == false ? " (non-persistent)" : "")];
      continue;
    }
    out << "    " << std::left << std::setw(int(w)) << display_name(e.arg.name) << "  " << value_text(e.arg) << "\n";
  }
  if (!others.empty()) {
    out << "    and";
    bool first = true;
    for (const auto& [role, n] : others) {
      out << (first ? " " : ", ") << n << " " << role;
      first = false;
    }
    out << "\n";
  }
}

}  // namespace

void print_pt2_text(std::ostream& out, const ckpt::checkpoint& c, const text_options& options) {
  const ckpt::pt2::archive_info& a = *c.pt2;
  out << "\ntorch.export archive: version " << escape_controls(a.archive_version) << ", root folder "
      << display_name(a.root) << ", " << a.models.size() << (a.models.size() == 1 ? " model" : " models") << "\n";
  for (const auto& m : a.models) {
    const ckpt::pt2::program& p = m.prog;
    out << "model " << display_name(m.name) << " (" << display_name(p.record);
    if (!m.key_prefix.empty()) out << ", keys " << display_name(m.key_prefix) << "...";
    out << "): schema " << p.schema_major.value_or(0) << "." << p.schema_minor.value_or(0);
    for (const auto& [ns, v] : p.opset_version) out << ", opset " << display_name(ns) << " " << v;
    if (!p.torch_version.empty()) out << ", torch " << escape_controls(p.torch_version);
    for (const auto& v : p.verifiers) out << ", " << escape_controls(v) << " IR";
    out << "\n";
    out << "  " << m.weights << " weights, " << m.constants << " constants, " << p.nodes.size() << " graph nodes"
        << (m.sample_inputs ? ", sample inputs" : ", NO sample inputs (torch.export.load needs them)") << "\n";
    if (!p.call.empty()) out << "  call: forward" << escape_controls(p.call) << "\n";
    if (!p.forward_arg_names.empty()) {
      out << "  argument names:";
      for (const auto& n : p.forward_arg_names) out << " " << display_name(n);
      out << "\n";
    }
    print_signature(out, "inputs", p.inputs, "user_input");
    print_signature(out, "outputs", p.outputs, "user_output");
    if (!p.ranges.empty()) {
      out << "  symbolic dims:\n";
      std::map<std::string, const ckpt::pt2::dim*> hints;
      for (const auto& e : p.inputs)
        for (const auto& d : e.arg.shape)
          if (!d.value && d.hint) hints.emplace(d.expr, &d);
      for (const auto& r : p.ranges) {
        out << "    " << escape_controls(r.text());
        auto h = hints.find(r.symbol);
        if (h != hints.end()) out << "  (exported at " << *h->second->hint << ")";
        out << "\n";
      }
    }
    for (const auto& o : m.opaque)
      out << "  not read: " << display_name(m.key_prefix + o.fqn) << ": " << o.what << ", " << display_name(o.file) << ", "
          << human_bytes(o.nbytes) << "\n";
    if (options.graph) {
      out << "  graph:\n";
      for (const auto& n : p.nodes) {
        if (!key_matches(options.filter, n.name)) continue;
        out << "    " << std::left << std::setw(24) << display_name(n.name) << " " << escape_controls(n.target);
        for (const auto& o : n.outputs) out << "  -> " << value_text(o);
        if (!n.module.empty()) out << "  in " << display_name(n.module) << " (" << escape_controls(n.module_type) << ")";
        out << "\n";
      }
    }
  }
  if (!a.aoti_models.empty()) {
    out << "AOTInductor models (compiled code; not read here):";
    for (const auto& n : a.aoti_models) out << " " << display_name(n);
    out << "\n";
  }
  for (const auto& [n, size] : a.extra_files) out << "extra file: " << display_name(n) << ", " << human_bytes(size) << "\n";
  for (const auto& r : a.other_records) out << "other record: " << display_name(r) << "\n";
}

}  // namespace cli
