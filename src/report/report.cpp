#include "ckpt/report.h"

#include <algorithm>
#include <array>
#include <map>
#include <string>

#include "ckpt/wrappers.h"
#include "report/json_writer.h"

namespace ckpt {

std::vector<std::string> tensor_keys(const checkpoint& c) {
  std::vector<std::string> keys;
  if (c.state_dict) {
    keys.reserve(c.keys.size());
    for (size_t k = 0; k < c.keys.size(); ++k) keys.emplace_back(c.keys.key(k));
  } else {
    for (const auto& t : c.tensors) keys.push_back(path_to_string(t.path));
  }
  return keys;
}

namespace {

void write_path(detail::json_writer& w, const value_path& path) {
  w.begin_array();
  for (const auto& step : path) {
    if (const auto* s = std::get_if<std::string>(&step))
      w.string(*s);
    else
      w.number(std::get<int64_t>(step));
  }
  w.end_array();
}

// Any range of integers (a vector, a dim_list), written where it lies: no copy per row.
template <typename Ints>
void write_ints(detail::json_writer& w, const Ints& v, size_t pad_to = 0) {
  w.ints(v.data(), v.size(), pad_to);
}

void write_strings(detail::json_writer& w, const std::vector<std::string>& v) {
  w.begin_array();
  for (const auto& x : v) w.string(x);
  w.end_array();
}

// Per-channel values saved as tensors are named by their storage: inspect reads no tensor
// bytes.
nlohmann::json quantization_json(const checkpoint& c, const quantization& q) {
  nlohmann::json j = {{"scheme", q.scheme}};
  if (!q.per_channel()) {
    j["scale"] = q.scale;
    j["zero_point"] = q.zero_point;
    return j;
  }
  j["axis"] = q.axis;
  auto values = [&](const std::shared_ptr<const tensor_record>& t, const std::vector<double>& list) {
    return t ? nlohmann::json{{"storage", c.storages[*t->storage].key}, {"dtype", name(t->type)}}
             : nlohmann::json(list);
  };
  j["scales"] = values(q.scales, q.scale_list);
  j["zero_points"] = values(q.zero_points, q.zero_point_list);
  return j;
}

// A sparse or nested tensor's parts, or a DTensor's mesh and placements.
nlohmann::json kind_json(const checkpoint& c, const tensor_kind& k) {
  nlohmann::json j = {{"layout", k.layout}};
  if (k.coalesced) j["coalesced"] = *k.coalesced;
  if (k.layout == "jagged") j["ragged_dim"] = k.ragged_dim;
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& [part_name, t] : k.components)
    parts.push_back({{"name", part_name},
                     {"dtype", name(t->type)},
                     {"shape", t->shape},
                     {"stride", t->stride},
                     {"storage", c.storages[*t->storage].key},
                     {"storage_offset", t->storage_offset},
                     {"nbytes", t->nbytes()}});
  j["components"] = std::move(parts);
  if (!k.subclass.empty()) {
    j["subclass"] = k.subclass;
    j["global_shape"] = k.global_shape;
    j["mesh"] = {{"shape", k.mesh_shape}, {"dim_names", k.mesh_dim_names}};
    j["placements"] = k.placements;
  }
  return j;
}

// Members in nlohmann's order (sorted keys); each row of the tensor and storage tables.
void write_tensor(detail::json_writer& w, const checkpoint& c, const tensor_record& t) {
  w.begin_object();
  // Only where set, as torch.save writes them: most checkpoints never have either.
  if (t.conj) {
    w.key("conj");
    w.boolean(true);
  }
  w.key("device");
  w.string(t.location);
  w.key("dtype");
  w.string(name(t.type));
  if (t.kind) {
    w.key("kind");
    w.value(kind_json(c, *t.kind));
  }
  w.key("layout");
  w.string(t.composite() ? t.kind->layout : "strided");
  w.key("nbytes");
  w.number(t.nbytes());
  if (t.neg) {
    w.key("neg");
    w.boolean(true);
  }
  w.key("parameter");
  w.boolean(t.parameter);
  w.key("path");
  write_path(w, t.path);
  if (t.quant) {
    w.key("quantization");
    w.value(quantization_json(c, *t.quant));
  }
  w.key("requires_grad");
  w.boolean(t.requires_grad);
  w.key("shape");
  write_ints(w, t.shape);
  w.key("storage");
  if (t.storage)
    w.string(c.storages[*t.storage].key);
  else
    w.null();
  w.key("storage_offset");
  w.number(t.storage_offset);
  w.key("stride");
  write_ints(w, t.stride);
  w.end_object();
}

void write_storage(detail::json_writer& w, const storage_record& s) {
  w.begin_object();
  if (s.archive_range) {
    w.key("archive_range");
    w.boolean(true);
  }
  w.key("device");
  w.string(s.location);
  w.key("dtype");
  w.string(name(s.type));
  w.key("file");
  w.number(uint64_t(s.file));
  w.key("key");
  w.string(s.key);
  w.key("nbytes");
  w.number(s.nbytes);
  w.key("offset");
  if (s.file_offset)
    w.number(*s.file_offset);
  else
    w.null();
  w.key("tensors");
  w.number(uint64_t(s.tensor_count));
  w.end_object();
}

// A set's state dict: each key with its dtype, global shape and pieces (the box each piece
// fills and the byte range it comes from).
void write_keys(detail::json_writer& w, const checkpoint& c, const std::function<bool(const tensor_record&)>& keep) {
  w.begin_array();
  for (size_t k = 0; k < c.keys.size(); ++k) {
    const size_t n = c.keys.piece_count(k);
    if (keep) {
      bool any = n == 0;
      for (size_t p = 0; p < n && !any; ++p) any = keep(c.tensors[c.keys.piece(k, p).tensor]);
      if (!any) continue;
    }
    w.begin_object();
    w.key("dtype");
    w.string(name(c.keys.type(k, c.tensors)));
    w.key("key");
    w.string(c.keys.key(k));
    w.key("pieces");
    w.begin_array();
    for (size_t p = 0; p < n; ++p) {
      const tensor_piece piece = c.keys.piece(k, p);
      const tensor_record& t = c.tensors[piece.tensor];
      w.begin_object();
      if (t.storage) {
        const storage_record& s = c.storages[*t.storage];
        w.key("data");
        w.boolean(!s.archive_range);
        w.key("file");
        w.number(uint64_t(s.file));
        w.key("nbytes");
        w.number(s.nbytes);
        w.key("offset");
        if (s.file_offset)
          w.number(*s.file_offset);
        else
          w.null();
      }
      w.key("offsets");
      // A piece's offsets are padded with zeros to the tensor's rank.
      if (piece.offsets.size() > t.shape.size())
        write_ints(w, std::vector<int64_t>(piece.offsets.begin(), piece.offsets.begin() + t.shape.size()));
      else
        write_ints(w, piece.offsets, t.shape.size());
      w.key("sizes");
      write_ints(w, t.shape);
      w.key("tensor");
      w.number(uint64_t(piece.tensor));
      w.end_object();
    }
    w.end_array();
    w.key("shape");
    write_ints(w, c.keys.shape(k, c.tensors));
    w.end_object();
  }
  w.end_array();
}

nlohmann::json totals_json(const checkpoint& c, const std::function<bool(const tensor_record&)>& keep) {
  uint64_t total_numel = 0, total_bytes = 0, count = 0;
  std::map<std::string, std::array<uint64_t, 3>> by_dtype;
  for (const auto& t : c.tensors) {
    if (keep && !keep(t)) continue;
    ++count;
    total_numel += t.numel();
    total_bytes += t.nbytes();
    auto& row = by_dtype[name(t.type)];
    row[0] += 1;
    row[1] += t.numel();
    row[2] += t.nbytes();
  }
  nlohmann::json dtypes = nlohmann::json::object();
  for (auto& [dt, row] : by_dtype) dtypes[dt] = {{"tensors", row[0]}, {"numel", row[1]}, {"nbytes", row[2]}};
  return {{"tensors", count}, {"numel", total_numel}, {"nbytes", total_bytes}, {"by_dtype", std::move(dtypes)}};
}

}  // namespace

void write_json_with_pairs(const nlohmann::json& doc, std::string_view key,
                           const std::vector<std::pair<std::string, std::string>>& pairs,
                           const std::function<void(std::string_view)>& sink) {
  detail::json_writer w(sink);
  bool written = false;
  auto write_pairs = [&] {
    w.key(key);
    w.begin_array();
    for (const auto& [from, to] : pairs) {
      w.begin_object();
      w.key("new");
      w.string(to);
      w.key("old");
      w.string(from);
      w.end_object();
    }
    w.end_array();
    written = true;
  };
  w.begin_object();
  // nlohmann's objects iterate sorted by key, the order json_writer wants.
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (!written && std::string_view(it.key()) > key) write_pairs();
    w.key(it.key());
    w.value(it.value());
  }
  if (!written) write_pairs();
  w.end_object();
  w.flush();
}

void write_inspect_json(const checkpoint& c, const inspect_json_options& options,
                        const std::function<void(std::string_view)>& sink) {
  detail::json_writer w(sink, options.indent);
  // Keyed by member name: std::map walks them in the order nlohmann prints an object's.
  std::map<std::string, std::function<void()>> members;
  members["schema"] = [&] { w.number(int64_t(kInspectSchemaVersion)); };
  members["file"] = [&] { w.string(c.path); };
  members["file_size"] = [&] { w.number(c.file_size()); };
  members["files"] = [&] {
    w.begin_array();
    for (const auto& f : c.files) {
      w.begin_object();
      w.key("format");
      w.string(format_name(f.format));
      if (f.within) {
        w.key("offset");
        w.number(f.offset_within);
      }
      w.key("path");
      w.string(f.path);
      w.key("size");
      w.number(f.size);
      w.key("tensors");
      w.number(uint64_t(f.tensors));
      if (f.within) {
        w.key("within");
        w.number(uint64_t(*f.within));
      }
      w.end_object();
    }
    w.end_array();
  };
  members["format"] = [&] { w.string(format_name(c.format)); };
  members["layout"] = [&] { w.string(layout_name(c.layout)); };
  members["index"] = [&] {
    if (c.index_path.empty())
      w.null();
    else
      w.string(c.index_path);
  };
  members["warnings"] = [&] { write_strings(w, c.warnings); };
  if (c.layout != checkpoint_layout::single_file) {
    members["writer"] = [&] {
      if (c.writer.empty())
        w.null();
      else
        w.string(c.writer);
    };
    members["keys"] = [&] { write_keys(w, c, options.keep_tensor); };
  }
  members["io"] = [&] {
    w.begin_object();
    w.key("bytes_read");
    w.number(c.bytes_read() + options.extra_bytes_read);
    w.end_object();
  };
  members["state_dict"] = [&] {
    if (c.state_dict)
      write_path(w, *c.state_dict);
    else
      w.null();
  };
  members["lightning"] = [&] { w.boolean(c.lightning); };
  if (!c.module_class.empty())
    members["pickled_module"] = [&] {
      w.begin_object();
      w.key("class");
      w.string(c.module_class);
      w.key("state_dict_keys");
      w.begin_array();
      for (size_t k = 0; k < c.keys.size(); ++k) {
        w.begin_object();
        w.key("key");
        w.string(c.keys.key(k));
        w.key("path");
        write_path(w, c.tensors[c.keys.tensor(k)].path);
        w.end_object();
      }
      w.end_array();
      if (!c.module_unread.empty()) {
        w.key("unread");
        w.string(c.module_unread);
      }
      w.key("weights_only");
      w.boolean(false);
      w.end_object();
    };
  members["byteorder"] = [&] { w.string(c.byteorder); };
  members["tensors"] = [&] {
    w.begin_array();
    for (const auto& t : c.tensors)
      if (!options.keep_tensor || options.keep_tensor(t)) write_tensor(w, c, t);
    w.end_array();
  };
  members["aliases"] = [&] {
    w.begin_array();
    for (const auto& a : c.aliases) {
      w.begin_object();
      w.key("path");
      write_path(w, a.path);
      w.key("same_as");
      write_path(w, c.tensors[a.tensor].path);
      w.end_object();
    }
    w.end_array();
  };
  members["storages"] = [&] {
    w.begin_array();
    for (const auto& s : c.storages) write_storage(w, s);
    w.end_array();
  };
  members["wrappers"] = [&] {
    nlohmann::json wrappers = nlohmann::json::object();
    for (auto& [segment, count] : count_wrappers(tensor_keys(c))) wrappers[segment] = count;
    w.value(wrappers);
  };
  members["unsafe_globals"] = [&] { write_strings(w, c.unsafe_globals); };
  members["globals"] = [&] { write_strings(w, c.globals); };
  members["unknown_records"] = [&] { write_strings(w, c.unknown_records); };
  members["entries"] = [&] {
    w.begin_array();
    for (const auto& e : c.entries) {
      w.begin_object();
      w.key("path");
      write_path(w, e.path);
      w.key("type");
      w.string(e.type);
      w.key("value");
      w.string(e.value);
      w.end_object();
    }
    w.end_array();
  };
  members["totals"] = [&] { w.value(totals_json(c, nullptr)); };
  // "totals" has always counted the whole file; what a filter kept is counted beside it.
  if (options.keep_tensor) members["filtered_totals"] = [&] { w.value(totals_json(c, options.keep_tensor)); };
  for (const auto& [key, v] : options.extra.items()) {
    const nlohmann::json* value = &v;
    members[key] = [&w, value] { w.value(*value); };
  }

  w.begin_object();
  for (const auto& [key, write] : members) {
    w.key(key);
    write();
  }
  w.end_object();
  w.flush();
}

}  // namespace ckpt
