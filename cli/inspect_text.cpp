#include "inspect_text.h"

#include <fnmatch.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <map>
#include <memory>
#include <set>

#include "ckpt/report.h"
#include "base/text_escape.h"
#include "ckpt/wrappers.h"
#include "common.h"
#include "text_table.h"
#include "base/text.h"

namespace cli {
namespace {

using ckpt::display_name;
using ckpt::escape_controls;

struct row {
  std::string key, dtype, shape, bytes, notes;
};

size_t key_width(const std::string& key) { return std::min<size_t>(key.size(), 72); }

// Rows are made twice, once to size the columns and once to print, and never all kept: for a
// million tensors the kept rows were 370 bytes each, more than the checkpoint's records.
// The notes (the last column, the costly one) are made only for printing.
template <class List, class Rows>
void print_table(std::ostream& out, const List& list, const Rows& make_row) {
  size_t w[4] = {3, 5, 5, 5};
  make_row(list, false, [&](const row& r) {
    w[0] = std::max(w[0], key_width(r.key));
    w[1] = std::max(w[1], r.dtype.size());
    w[2] = std::max(w[2], r.shape.size());
    w[3] = std::max(w[3], r.bytes.size());
  });
  table_lines lines(out);
  auto line = [&](const row& r) {
    lines.text("  ").left(r.key, w[0]).text("  ").left(r.dtype, w[1]).text("  ").left(r.shape, w[2]).text("  ");
    lines.right(r.bytes, w[3]);
    if (!r.notes.empty()) lines.text("  ").text(r.notes);
    lines.end_line();
  };
  line({"KEY", "DTYPE", "SHAPE", "BYTES", "NOTES"});
  make_row(list, true, line);
  lines.flush();
  // The stream's alignment as the manipulators this replaced left it.
  out.setf(std::ios::right, std::ios::adjustfield);
}

// Shortest form that reads back as the same double, as Python's repr does ("0.01").
std::string format_number(double x) {
  char buf[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}

bool is_contiguous(const ckpt::tensor_record& t) {
  int64_t expected = 1;
  for (size_t i = t.shape.size(); i-- > 0;) {
    if (t.shape[i] != 1 && t.stride[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

// "sparse CSR, nnz 11: crow_indices int64 [5], col_indices int64 [11], values float32 [11]";
// a DTensor's global shape, mesh and placements.
std::string kind_note(const ckpt::tensor_kind& k) {
  std::string out;
  if (!k.subclass.empty()) {
    out = "DTensor, local shard of " + ckpt::text::shape(k.global_shape) + ", mesh ";
    std::string mesh;
    for (size_t i = 0; i < k.mesh_shape.size(); ++i)
      mesh += (i ? ", " : "") + (i < k.mesh_dim_names.size() ? escape_controls(k.mesh_dim_names[i]) + "=" : "") +
              std::to_string(k.mesh_shape[i]);
    out += "(" + mesh + "), placements ";
    for (size_t i = 0; i < k.placements.size(); ++i) out += (i ? ", " : "") + escape_controls(k.placements[i]);
    return out;
  }
  out = k.description();
  if (k.sparse()) {
    const auto& index = *k.components[k.components.size() - 2].second;
    out += ", nnz " + std::to_string(index.shape.empty() ? 0 : index.shape.back());
    if (k.coalesced) out += *k.coalesced ? ", coalesced" : ", not coalesced";
  } else if (k.layout == "jagged") {
    out += ", ragged dim " + std::to_string(k.ragged_dim);
  }
  out += ":";
  for (size_t i = 0; i < k.components.size(); ++i)
    out += std::string(i ? "," : "") + " " + k.components[i].first + " " + ckpt::name(k.components[i].second->type) +
           " " + ckpt::text::shape(k.components[i].second->shape);
  return out;
}

row tensor_row(const ckpt::checkpoint& c, const ckpt::tensor_record& t, const std::string& key, bool with_notes) {
  if (!with_notes) return {display_name(key), ckpt::name(t.type), shape_text(t.shape), human_bytes(t.nbytes()), {}};
  std::vector<std::string> notes;
  if (t.parameter) notes.push_back("param");
  if (t.conj) notes.push_back("conj bit (values are the stored ones conjugated)");
  if (t.neg) notes.push_back("neg bit (values are the stored ones negated)");
  if (t.kind) notes.push_back(kind_note(*t.kind));
  if (!t.storage && !t.composite()) notes.push_back("meta");
  if (t.quant) {
    const auto& q = *t.quant;
    if (q.per_channel())
      notes.push_back(escape_controls(q.scheme) + ", axis " + std::to_string(q.axis));
    else
      notes.push_back("scale " + format_number(q.scale) + ", zero point " + std::to_string(q.zero_point));
  }
  if (t.storage) {
    const auto& s = c.storages[*t.storage];
    if (s.tensor_count > 1) notes.push_back("shares storage " + display_name(s.key) + " (" + std::to_string(s.tensor_count) + " tensors)");
    if (t.storage_offset != 0) notes.push_back("offset " + std::to_string(t.storage_offset));
  }
  if (!t.composite() && !is_contiguous(t)) notes.push_back("strided " + ckpt::text::shape(t.stride));
  if (!t.location.empty() && t.location != "cpu" && t.location != "meta") notes.push_back("saved on " + display_name(t.location));
  std::string joined;
  for (const auto& n : notes) joined += (joined.empty() ? "" : ", ") + n;
  return {display_name(key), ckpt::name(t.type), shape_text(t.shape), human_bytes(t.nbytes()), joined};
}

const char* wrapper_origin(const std::string& segment) {
  if (segment == "_orig_mod.") return "torch.compile";
  if (segment == "module.") return "DDP/DataParallel";
  if (segment == "_fsdp_wrapped_module.") return "FSDP";
  if (segment == "_checkpoint_wrapped_module.") return "activation checkpointing";
  if (segment == "_forward_module.") return "Lightning Fabric";
  if (segment == "model.") return "LightningModule attribute, or part of the model's own names";
  return "";
}

constexpr size_t kMaxTreeDepth = 32;

struct tree_node {
  std::map<std::string, std::unique_ptr<tree_node>> children;
  std::vector<std::string> order;
  uint64_t numel = 0;
  const ckpt::tensor_record* leaf = nullptr;
};

void print_tree(std::ostream& out, const tree_node& node, const std::string& name, int depth) {
  std::string label = std::string(size_t(depth) * 2, ' ') + display_name(name);
  out << "  " << std::left << std::setw(48) << label;
  if (node.leaf)
    out << "  " << ckpt::name(node.leaf->type) << " " << ckpt::text::shape(node.leaf->shape);
  else
    out << "  " << with_commas(node.numel) << " elements";
  out << "\n";
  for (const auto& child : node.order) print_tree(out, *node.children.at(child), child, depth + 1);
}

// The tensors listed are c.tensors' own records.
size_t index_of(const ckpt::checkpoint& c, const ckpt::tensor_record* t) { return size_t(t - c.tensors.data()); }

}  // namespace

bool key_matches(const std::string& glob, const std::string& key) {
  return glob.empty() || ::fnmatch(glob.c_str(), key.c_str(), 0) == 0;
}

void print_inspect_text(std::ostream& out, const ckpt::checkpoint& c, const ckpt::torchscript_info* ts,
                        const text_options& options) {
  if (c.layout == ckpt::checkpoint_layout::dcp) return print_set_text(out, c, options);
  out << display_name(c.path) << ": " << ckpt::format_name(c.format);
  if (c.lightning) out << " (Lightning checkpoint)";
  out << ", " << human_bytes(c.file_size()) << "\n";
  if (c.layout != ckpt::checkpoint_layout::single_file) {
    out << "layout: " << ckpt::layout_name(c.layout);
    if (!c.index_path.empty()) out << ", index " << display_name(c.index_path);
    out << ", " << c.files.size() << (c.files.size() == 1 ? " file" : " files") << "\n";
  }
  if (c.files.size() > 1 || c.layout != ckpt::checkpoint_layout::single_file) {
    size_t w = 4;
    for (const auto& f : c.files) w = std::max(w, display_name(f.path).size());
    out << "  " << std::left << std::setw(int(w)) << "FILE" << "  " << std::setw(12) << "FORMAT" << std::right
        << std::setw(10) << "BYTES" << std::setw(9) << "TENSORS" << "\n";
    for (const auto& f : c.files)
      out << "  " << std::left << std::setw(int(w)) << display_name(f.path) << "  " << std::setw(12)
          << ckpt::format_name(f.format) << std::right << std::setw(10) << human_bytes(f.size) << std::setw(9)
          << f.tensors << "\n";
  }
  if (!c.warnings.empty()) {
    out << "warnings:\n";
    for (const auto& warning : c.warnings) out << "  " << escape_controls(warning) << "\n";
  }

  // The state dict's tensors by key, then everything else by path.
  std::vector<std::pair<std::string, const ckpt::tensor_record*>> sd, other;
  std::vector<bool> in_sd(c.tensors.size(), false);
  sd.reserve(c.keys.size());
  for (size_t k = 0; k < c.keys.size(); ++k) {
    const size_t i = c.keys.tensor(k);
    sd.emplace_back(std::string(c.keys.key(k)), &c.tensors[i]);
    in_sd[i] = true;
  }
  for (size_t i = 0; i < c.tensors.size(); ++i)
    if (!in_sd[i]) other.emplace_back(ckpt::path_to_string(c.tensors[i].path), &c.tensors[i]);

  if (c.state_dict) {
    // Tied keys (two keys, one tensor object) are one tensor, as in the totals below.
    uint64_t numel = 0;
    std::vector<bool> counted(c.tensors.size(), false);
    size_t distinct = 0;
    for (auto& [k, t] : sd)
      if (!counted[index_of(c, t)]) {
        counted[index_of(c, t)] = true;
        ++distinct;
        numel += t->numel();
      }
    std::string where = c.state_dict->empty() ? "the root" : "'" + display_name(ckpt::path_to_string(*c.state_dict)) + "'";
    out << "state dict: " << where << ", ";
    if (distinct != sd.size()) out << sd.size() << " keys, ";
    out << distinct << " tensors, " << with_commas(numel) << " elements\n";
    if (!c.module_class.empty())
      out << "pickled nn.Module: " << display_name(c.module_class)
          << " (state dict keys found through _modules/_parameters/_buffers, as state_dict() gives them)\n"
          << "  torch.load needs weights_only=False for it, which imports and runs its classes' code: unsafe;\n"
          << "  ckptool materialize FILE --device cpu -o OUT writes the state dict alone\n";
  } else if (!c.module_class.empty()) {
    out << "state dict: none recognised (tensors listed by path)\n"
        << "pickled nn.Module: " << display_name(c.module_class) << ", whose state_dict() keys the file cannot tell: "
        << escape_controls(c.module_unread) << "\n"
        << "  torch.load needs weights_only=False for it, which imports and runs its classes' code: unsafe\n";
  } else if (c.format != ckpt::file_format::torchscript) {
    out << "state dict: none recognised (tensors listed by path)\n";
  }

  auto wrappers = ckpt::count_wrappers(ckpt::tensor_keys(c));
  if (!wrappers.empty()) {
    out << "wrapper segments:\n";
    for (auto& [segment, count] : wrappers)
      out << "  " << std::left << std::setw(30) << segment << std::right << std::setw(7) << count << " keys  ("
          << wrapper_origin(segment) << ")\n";
    if (wrappers.count("_orig_mod.")) out << "  (ckptool rekey --strip-compiled removes '_orig_mod.')\n";
  }

  if (ts) {
    out << "module: " << escape_controls(ts->type) << (ts->training ? " (training)" : " (eval)") << "\n";
    out << "  methods:\n";
    for (const auto& m : ts->methods) out << "    " << escape_controls(m.schema) << "\n";
    if (!ts->submodule_methods.empty()) {
      out << "  submodule methods:\n";
      for (const auto& m : ts->submodule_methods)
        out << "    " << std::left << std::setw(40) << display_name(m.name) << " " << escape_controls(m.schema) << "\n";
    }
    if (!ts->submodules.empty()) {
      out << "  submodules:\n";
      for (const auto& s : ts->submodules) out << "    " << std::left << std::setw(40) << display_name(s.name) << " " << escape_controls(s.type) << "\n";
    }
    auto list = [&](const char* title, const std::vector<ckpt::ts_tensor>& ts_tensors) {
      out << "  " << title << " (" << ts_tensors.size() << "):\n";
      for (const auto& p : ts_tensors)
        if (key_matches(options.filter, p.name))
          out << "    " << std::left << std::setw(40) << display_name(p.name) << " " << std::setw(9)
              << escape_controls(p.dtype) << " "
              << ckpt::text::shape(p.shape) << (p.tied_to.empty() ? "" : "  tied to " + display_name(p.tied_to)) << "\n";
    };
    list("parameters", ts->parameters);
    list("buffers", ts->buffers);
    if (!ts->attributes.empty()) {
      out << "  attributes:\n";
      for (const auto& a : ts->attributes)
        out << "    " << std::left << std::setw(40) << display_name(a.name) << " " << escape_controls(a.type)
            << (a.value.empty() ? "" : " = " + escape_controls(a.value)) << "\n";
    }
  }

  if (options.tree) {
    tree_node root;
    for (auto& [key, t] : (c.state_dict ? sd : other)) {
      if (!key_matches(options.filter, key)) continue;
      tree_node* node = &root;
      root.numel += t->numel();
      std::vector<std::string_view> segs = ckpt::split_key(key);
      // Keys come from the file: past kMaxTreeDepth levels the rest of a key is one node,
      // so neither the tree nor its printing follows a key of a million dots.
      if (segs.size() > kMaxTreeDepth) {
        size_t from = size_t(segs[kMaxTreeDepth - 1].data() - key.data());
        segs.resize(kMaxTreeDepth);
        segs.back() = std::string_view(key).substr(from);
      }
      for (auto seg : segs) {
        std::string s(seg);
        auto& child = node->children[s];
        if (!child) {
          child = std::make_unique<tree_node>();
          node->order.push_back(s);
        }
        node = child.get();
        node->numel += t->numel();
      }
      node->leaf = t;
    }
    out << "tree:\n";
    print_tree(out, root, "(root)", 0);
  } else if (!ts) {
    auto rows = [&](const auto& list, bool with_notes, const auto& each) {
      for (auto& [key, t] : list)
        if (key_matches(options.filter, key)) each(tensor_row(c, *t, key, with_notes));
    };
    auto any_row = [&](const auto& list) {
      return std::any_of(list.begin(), list.end(), [&](const auto& kt) { return key_matches(options.filter, kt.first); });
    };
    if (any_row(sd)) {
      out << "\n";
      print_table(out, sd, rows);
    }
    if (any_row(other)) {
      out << (c.state_dict ? "\nother tensors:\n" : "\n");
      print_table(out, other, rows);
    }
  }

  // The totals count what was listed: with --filter, only the matching tensors.
  // By index into c.tensors, where every listed record lives: a std::set of a million
  // pointers was 48 MB and a tree walk per insert.
  std::vector<bool> shown(c.tensors.size(), false);
  size_t shown_count = 0, shown_paths = 0;
  auto show = [&](const ckpt::tensor_record* t) {
    ++shown_paths;
    const size_t i = index_of(c, t);
    if (!shown[i]) {
      shown[i] = true;
      ++shown_count;
    }
  };
  if (options.filter.empty()) {
    shown.assign(c.tensors.size(), true);
    shown_count = c.tensors.size();
    shown_paths = c.tensors.size() + c.aliases.size();
  } else {
    auto add = [&](const auto& list) {
      for (auto& [key, t] : list)
        if (key_matches(options.filter, key)) show(t);
    };
    add(sd);
    if (ts) {
      // The module listing above names tensors "head.weight", not by pickle path.
      for (auto& [path, t] : other)
        if (key_matches(options.filter, ckpt::path_to_string(t->path, '.'))) show(t);
    } else if (!(options.tree && c.state_dict)) {
      add(other);
    }
  }
  uint64_t numel = 0, bytes = 0;
  std::set<size_t> storages;
  std::map<std::string, std::array<uint64_t, 2>> by_dtype;
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    if (!shown[i]) continue;
    const ckpt::tensor_record* t = &c.tensors[i];
    numel += t->numel();
    bytes += t->nbytes();
    if (t->storage) storages.insert(*t->storage);
    if (t->kind)  // a sparse or nested tensor's parts, a DTensor's mesh ranks
      for (const auto& part : t->kind->components) storages.insert(*part.second->storage);
    by_dtype[ckpt::name(t->type)][0]++;
    by_dtype[ckpt::name(t->type)][1] += t->nbytes();
  }
  out << "\ntotals";
  if (!options.filter.empty()) out << " of the tensors matching --filter";
  out << ": " << shown_count << " tensors, " << with_commas(numel) << " elements, " << human_bytes(bytes) << " in "
      << (options.filter.empty() ? c.storages.size() : storages.size()) << " storages\n";
  for (auto& [dt, v] : by_dtype)
    out << "  " << std::left << std::setw(16) << dt << std::right << std::setw(8) << v[0] << " tensors  "
        << human_bytes(v[1]) << "\n";
  if (shown_paths > shown_count)
    out << "  " << shown_paths - shown_count << " more paths refer to tensors listed above (the same tensor object; counted once)\n";
  if (!options.filter.empty())
    out << "  (the file holds " << c.tensors.size() << " tensors in " << c.storages.size() << " storages)\n";

  if (c.pt2) print_pt2_text(out, c, options);

  if (!c.entries.empty()) {
    out << "\nentries:\n";
    for (const auto& e : c.entries)
      out << "  " << std::left << std::setw(32) << display_name(ckpt::path_to_string(e.path)) << " " << std::setw(12)
          << escape_controls(e.type) << " " << escape_controls(e.value) << "\n";
  }

  out << "\n";
  if (c.format == ckpt::file_format::safetensors) {
    out << "no pickle: safetensors files hold no code\n";
  } else if (c.format == ckpt::file_format::pt2) {
    out << "no pickle read: a torch.export archive's weights are raw bytes and its program JSON (pickled entries are listed, never read)\n";
  } else if (c.unsafe_globals.empty()) {
    out << "unsafe globals: none (torch.load(weights_only=True) would accept the pickle's globals)\n";
  } else {
    out << "UNSAFE globals (torch.load(weights_only=False) would import and may run them):\n";
    for (const auto& g : c.unsafe_globals) out << "  " << display_name(g) << "\n";
  }
  if (c.byteorder != "little") out << "byte order: " << escape_controls(c.byteorder) << "-endian data\n";
  if (!c.unknown_records.empty()) {
    out << "records torch.save never writes (torch.load ignores them):\n";
    for (const auto& r : c.unknown_records) out << "  " << display_name(r) << "\n";
  }
}

void print_meta_outputs(std::ostream& out, const std::string& method, const std::vector<ckpt::meta_output>& outputs) {
  out << "\n" << method << " on meta tensors returns:\n";
  for (const auto& o : outputs) {
    out << "  " << (o.path.empty() ? "(result)" : display_name(o.path)) << ": ";
    if (o.is_tensor)
      out << escape_controls(o.dtype) << " " << ckpt::text::shape(o.shape) << "\n";
    else
      out << escape_controls(o.type) << (o.value.empty() ? "" : " = " + escape_controls(o.value)) << "\n";
  }
}

}  // namespace cli
