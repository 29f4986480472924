// What the reader relies on (docs/formats.md §9.10): HuggingFaceStorageReader.read_metadata
// lists every `*.safetensors` of the directory, takes each tensor of each file as one box
// at DCP_SHARDING_INFO[fqn].saved_offsets (zeros when the file has no such entry), and
// makes the global shape the largest offset + shape per dimension over the boxes. It checks
// nothing else; we check what it would silently get wrong (a box listed twice, dtypes or
// ranks that disagree, boxes that overlap or leave a gap) and refuse it.
#include "model/open_dcp_safetensors.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ckpt/dcp.h"
#include "ckpt/error.h"
#include "formats/dcp_sharding_info.h"
#include "base/text.h"

namespace ckpt::detail {
namespace {

std::string shape_text(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

struct box {
  size_t tensor;    // in the merged checkpoint
  uint32_t source;  // which file
  std::vector<int64_t> offsets;
};

struct key_boxes {
  std::string fqn;
  std::vector<box> boxes;
};

// `shard-00002-model-...`: the writer's rank + 1, for the gap warning.
std::optional<uint64_t> shard_number(const std::string& name) {
  if (name.compare(0, 6, "shard-") != 0) return std::nullopt;
  uint64_t n = 0;
  size_t i = 6;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && i < 24; ++i) n = n * 10 + uint64_t(name[i] - '0');
  return i > 6 ? std::optional<uint64_t>(n) : std::nullopt;
}

}  // namespace

checkpoint open_dcp_safetensors(const file_opener& fs, const layout& l, const open_options& given) {
  open_options options = given;
  options.intent = open_options::purpose::read;
  checkpoint c;
  c.path = fs.display(l.file);
  // A DCP checkpoint (keys, boxes, coverage as §9.4) whose files are safetensors: the
  // format tells it from the `.metadata` kind.
  c.layout = checkpoint_layout::dcp;
  c.format = file_format::safetensors;
  c.byteorder = "little";

  std::vector<key_boxes> keys;
  std::unordered_map<std::string, size_t> key_at;
  std::vector<std::string> shown;  // by source: the file as messages name it
  std::set<std::string> versions;
  uint64_t tensors = 0;
  for (const std::string& part : l.parts) {
    const std::string relative = text::file_in(l.file, part);
    const std::string name = fs.display(relative);
    std::unique_ptr<byte_source> src;
    try {
      src = fs.open(relative);
    } catch (error& e) {
      e.with_file(name);
      throw;
    }
    checkpoint s = open_checkpoint(std::move(src), options);
    if (s.format != file_format::safetensors)
      throw error(errc::unsupported, std::string("a ") + format_name(s.format) +
                                         " file among the safetensors pieces (HuggingFaceStorageReader reads every "
                                         "*.safetensors as safetensors)")
          .with_file(name);
    source_file& f = s.files.front();
    const safetensors::header& h = *f.st_header;
    std::optional<dcp::sharding_info> info;
    if (auto text = dcp::metadata_value(h.metadata, dcp::kShardingInfoKey)) {
      try {
        info = dcp::parse_sharding_info(*text);
      } catch (error& e) {
        e.with_file(name);
        throw;
      }
    }
    if (auto v = dcp::metadata_value(h.metadata, dcp::kVersionKey)) versions.insert(std::string(*v));
    tensors += s.tensors.size();
    if (tensors > options.max_tensors)
      throw error(errc::limit, "the pieces hold more than " + std::to_string(options.max_tensors) +
                                   " tensors (raise with --max-tensors)")
          .with_file(c.path);

    const uint32_t file = uint32_t(c.files.size());
    const size_t storage_base = c.storages.size(), tensor_base = c.tensors.size();
    for (storage_record& st : s.storages) {
      st.file = file;
      c.storages.push_back(std::move(st));
    }
    // read_safetensors makes one record per header entry, in header order.
    for (size_t i = 0; i < s.tensors.size(); ++i) {
      tensor_record& t = s.tensors[i];
      if (t.storage) *t.storage += storage_base;
      const std::string& fqn = h.tensors[i].name;
      std::vector<int64_t> offsets(t.shape.size(), 0);
      if (info) {
        auto it = info->offsets.find(fqn);
        // HuggingFaceStorageReader indexes the map with every key of the file (KeyError).
        if (it == info->offsets.end())
          throw error(errc::corrupt, "tensor '" + fqn + "' has no entry in __metadata__ " +
                                         std::string(dcp::kShardingInfoKey))
              .with_file(name);
        // The reader zips offsets with the shape, dropping the longer one's tail: the box
        // would then not be what either says.
        if (it->second.size() != t.shape.size())
          throw error(errc::corrupt, "tensor '" + fqn + "': saved_offsets " + shape_text(it->second) +
                                         " do not match its shape " +
                                         shape_text({t.shape.begin(), t.shape.end()}))
              .with_file(name);
        offsets = it->second;
      }
      for (size_t d = 0; d < offsets.size(); ++d)
        if (offsets[d] > INT64_MAX - t.shape[d])
          throw error(errc::corrupt, "tensor '" + fqn + "': saved_offsets " + shape_text(offsets) + " past any shape")
              .with_file(name);
      // Named as the DCP reader names a chunk's storage: one key's boxes share its name.
      if (t.storage) c.storages[*t.storage].key = fqn + "@" + dcp::format_shape(offsets);
      auto [at, fresh] = key_at.emplace(fqn, keys.size());
      if (fresh) keys.push_back({fqn, {}});
      keys[at->second].boxes.push_back({tensor_base + i, file, std::move(offsets)});
      c.tensors.push_back(std::move(t));
    }
    if (info) {
      std::unordered_set<std::string_view> held;
      held.reserve(h.tensors.size());
      for (const auto& e : h.tensors) held.insert(e.name);
      for (const auto& entry : info->offsets) {
        const std::string& fqn = entry.first;
        if (!held.count(fqn))
          c.warnings.push_back(name + ": __metadata__ DCP_SHARDING_INFO names '" + fqn +
                               "', which the file does not hold (ignored, as HuggingFaceStorageReader ignores it)");
      }
    } else {
      c.warnings.push_back(name + ": no __metadata__ DCP_SHARDING_INFO: its tensors are taken whole, at offset 0, as "
                                  "HuggingFaceStorageReader takes them");
    }
    c.globals.insert(c.globals.end(), s.globals.begin(), s.globals.end());
    c.files.push_back(std::move(f));
    shown.push_back(name);
  }
  if (c.files.empty()) throw error(errc::corrupt, "no safetensors file").with_file(c.path);
  if (!versions.empty()) {
    // DCP_VERSION, as a DCP .metadata's version is shown.
    for (auto it = versions.begin(); it != versions.end(); ++it) c.writer += (it == versions.begin() ? "" : "/") + *it;
  }
  if (versions.size() > 1) c.warnings.push_back("the pieces disagree on DCP_VERSION");

  // A missing rank file whose boxes held the last rows shrinks the shape the reader
  // infers instead of leaving a gap: the numbering is the only trace of it.
  std::set<uint64_t> numbers;
  for (const std::string& p : l.parts)
    if (auto n = shard_number(p)) numbers.insert(*n);
  if (!numbers.empty() && (*numbers.begin() != 1 || *numbers.rbegin() != numbers.size()))
    c.warnings.push_back("the shard-N numbers (ranks + 1) are not 1.." + std::to_string(*numbers.rbegin()) +
                         " without gaps: a rank with nothing to save writes no file, but a lost file that held a "
                         "tensor's last rows would make it look smaller, not incomplete");

  // Keys are added once the table holds only the records they use: an empty box beside
  // others holds nothing to load, and a record no key names would be read as one of its own.
  struct decided {
    const key_boxes* k;
    dtype type;
    std::vector<int64_t> size;
    std::vector<const box*> used;  // one record holding the key whole, or its pieces
    bool whole;
  };
  std::vector<decided> plan;
  plan.reserve(keys.size());
  for (const key_boxes& k : keys) {
    const tensor_record& first = c.tensors[k.boxes.front().tensor];
    dcp::tensor_meta tm;
    tm.type = first.type;
    tm.size.assign(first.shape.size(), 0);
    for (const box& b : k.boxes) {
      const tensor_record& t = c.tensors[b.tensor];
      if (t.shape.size() != tm.size.size())
        throw error(errc::corrupt, "tensor '" + k.fqn + "': a piece of " + std::to_string(t.shape.size()) +
                                       " dimensions, another of " + std::to_string(tm.size.size()))
            .with_file(shown[b.source]);
      if (t.type != tm.type)
        throw error(errc::corrupt, "tensor '" + k.fqn + "': a piece of " + ckpt::name(t.type) + ", another of " +
                                       ckpt::name(tm.type) + " (" + shown[k.boxes.front().source] + ")")
            .with_file(shown[b.source]);
      for (const box& o : k.boxes) {
        if (&o == &b) break;
        // storage_data is a dict keyed by (fqn, offsets): the reader keeps whichever file it
        // listed last, so two copies of one box have no single value.
        if (o.offsets == b.offsets)
          throw error(errc::corrupt, "tensor '" + k.fqn + "': the box at offsets " + shape_text(b.offsets) +
                                         " is also in " + shown[o.source])
              .with_file(shown[b.source]);
      }
      for (size_t d = 0; d < tm.size.size(); ++d) tm.size[d] = std::max(tm.size[d], b.offsets[d] + t.shape[d]);
      dcp::chunk ch;
      ch.offsets = b.offsets;
      ch.sizes.assign(t.shape.begin(), t.shape.end());
      ch.source = b.source;
      tm.chunks.push_back(std::move(ch));
    }
    dcp::check_coverage(k.fqn, tm, shown);
    const box* entire = nullptr;
    for (const box& b : k.boxes)
      if (std::equal(tm.size.begin(), tm.size.end(), c.tensors[b.tensor].shape.begin(), c.tensors[b.tensor].shape.end()))
        entire = &b;
    if (entire) {
      // Coverage leaves only empty boxes beside a whole one.
      plan.push_back({&k, tm.type, tm.size, {entire}, true});
      continue;
    }
    const bool none = std::any_of(tm.size.begin(), tm.size.end(), [](int64_t s) { return s == 0; });
    std::vector<const box*> used;
    for (const box& b : k.boxes) {
      const auto& sh = c.tensors[b.tensor].shape;
      // A tensor of no elements keeps its (empty) boxes: a key needs a piece.
      if (!none && std::any_of(sh.begin(), sh.end(), [](int64_t s) { return s == 0; })) continue;
      used.push_back(&b);
    }
    plan.push_back({&k, tm.type, tm.size, std::move(used), false});
  }

  // Every safetensors tensor has a storage of its own (read_safetensors), so the two
  // tables are compacted together.
  std::vector<size_t> remap(c.tensors.size(), SIZE_MAX);
  for (const decided& d : plan)
    for (const box* b : d.used) remap[b->tensor] = 0;
  std::vector<tensor_record> kept_tensors;
  std::vector<storage_record> kept_storages;
  for (auto& f : c.files) f.tensors = 0;
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    if (remap[i] == SIZE_MAX) continue;
    remap[i] = kept_tensors.size();
    tensor_record t = std::move(c.tensors[i]);
    if (t.storage) {
      storage_record& st = c.storages[*t.storage];
      c.files[st.file].tensors++;
      t.storage = kept_storages.size();
      kept_storages.push_back(std::move(st));
    }
    kept_tensors.push_back(std::move(t));
  }
  c.tensors = std::move(kept_tensors);
  c.storages = std::move(kept_storages);
  for (const decided& d : plan) {
    if (d.whole) {
      c.keys.add(d.k->fqn, remap[d.used.front()->tensor]);
      continue;
    }
    std::vector<tensor_piece> pieces;
    for (const box* b : d.used) pieces.push_back({remap[b->tensor], b->offsets});
    c.keys.add(d.k->fqn, d.type, d.size, std::move(pieces));
  }
  std::sort(c.globals.begin(), c.globals.end());
  c.globals.erase(std::unique(c.globals.begin(), c.globals.end()), c.globals.end());
  c.state_dict = value_path{};
  c.keys.shrink_to_fit();
  return c;
}

}  // namespace ckpt::detail
