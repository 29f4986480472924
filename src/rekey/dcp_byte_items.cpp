#include "rekey/dcp_byte_items.h"

#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/zip_reader.h"
#include "formats/dcp_transforms.h"
#include "io/slice_source.h"

namespace ckpt::dcp {
namespace {

// The strings that name a key being renamed: the key itself, and each dotted tail of it that
// the edit changes ("_orig_mod.0.weight" of "model._orig_mod.0.weight": an optimizer's
// param_groups list parameter names relative to the model, not to the checkpoint's root).
std::unordered_map<std::string, std::string> renamed_names(const rekey_plan& plan) {
  std::unordered_map<std::string, std::string> out;  // name -> the key it belongs to
  auto tail_kept = [](const std::string& key, const std::string& tail) {
    return key == tail || (key.size() > tail.size() && key.compare(key.size() - tail.size(), tail.size(), tail) == 0 &&
                           key[key.size() - tail.size() - 1] == '.');
  };
  for (const auto& [from, to] : plan.mapping) {
    if (from == to) continue;
    out.emplace(from, from);
    for (size_t dot = from.find('.'); dot != std::string::npos; dot = from.find('.', dot + 1)) {
      std::string tail = from.substr(dot + 1);
      if (tail.empty() || tail_kept(to, tail)) break;  // shorter tails are kept too
      out.emplace(std::move(tail), from);
    }
  }
  return out;
}

}  // namespace

void check_byte_items(const file_opener& in, const std::function<std::string(const std::string&)>& rel,
                      const metadata& md, const rekey_plan& plan, const pickle::limits& lim,
                      dcp_rekey_result& result) {
  std::unordered_map<std::string, std::string> new_names;
  for (const auto& [from, to] : plan.mapping)
    if (from != to) new_names.emplace(from, to);
  auto new_name = [&](const std::string& k) {
    auto it = new_names.find(k);
    return it == new_names.end() ? k : it->second;
  };
  std::unordered_map<std::string, std::string> names;
  bool names_made = false;
  std::unordered_set<std::string> bytes_items;
  for (const auto& it : md.items)
    if (!it.is_tensor) bytes_items.insert(it.fqn);
  std::map<std::string, std::shared_ptr<const byte_source>> opened;
  const zip::open_options zip_limits;
  uint64_t inflated = 0;
  for (const auto& s : md.storage_data) {
    if (!bytes_items.count(s.fqn)) continue;
    auto& file = opened[s.relative_path];
    if (!file) file = in.open(rel(s.relative_path));
    auto blob = std::make_unique<slice_source>(file, s.offset, s.length);
    // A value behind a stream transform (zstd) is searched as dcp.load would unpickle it:
    // inflated in memory, bounded as the reader bounds it (§9.6 item 6). An unknown
    // transform cannot be searched, so the rename cannot be shown exact: refused.
    std::unique_ptr<byte_source> inflated_blob;
    uint64_t base = s.offset;
    try {
      if (!s.transform_descriptors.empty()) {
        if (!detail::known_dcp_transforms(s.transform_descriptors))
          throw error(errc::unsupported, "the BYTE_IO value of '" + s.fqn + "' is behind a stream transform this "
                                             "reader does not know (" + s.transform_descriptors.front() +
                                             "): it cannot be searched for renamed keys",
                      s.offset);
        const uint64_t budget = zip_limits.max_inflated_total > inflated ? zip_limits.max_inflated_total - inflated : 0;
        std::vector<uint8_t> bytes =
            detail::undo_dcp_transforms(*blob, s.transform_descriptors, std::min(zip_limits.max_record_bytes, budget));
        inflated += bytes.size();
        inflated_blob = std::make_unique<memory_source>(std::move(bytes), file->name());
        // Offsets inside an inflated value are not the file's: errors name the item's start.
        base = 0;
      }
    } catch (error& e) {
      e.with_file(file->name());
      throw;
    }
    const byte_source& value = inflated_blob ? *inflated_blob : static_cast<const byte_source&>(*blob);
    const std::string where = inflated_blob ? " (" + s.transform_descriptors.front() + "-inflated value of the item at byte " +
                                                  std::to_string(s.offset) + ")"
                                            : std::string();
    try {
      auto ar = zip::archive::open(value);
      const zip::entry* e = ar->find("data.pkl");
      if (!e) throw_corrupt("the BYTE_IO value of '" + s.fqn + "' is a torch.save archive without data.pkl");
      std::vector<uint8_t> pkl = ar->read_record(*e);
      pickle::parse_options po;
      po.lim = lim;
      po.base_offset = base + e->data_offset;
      pickle::document doc = pickle::parse(pkl.data(), pkl.size(), po);
      if (!names_made && !new_names.empty()) names = renamed_names(plan);
      names_made = true;
      std::set<std::string> unsafe;
      for (const pickle::value& v : doc.nodes()) {
        auto hit = v.type == pickle::kind::str ? names.find(std::string(v.text)) : names.end();
        if (hit != names.end())
          throw error(errc::unsupported,
                      "the BYTE_IO value of '" + s.fqn + "' (which dcp.load unpickles as it is) holds the string '" +
                          hit->first + "', the name of '" + hit->second + "', which is being renamed: rekey copies "
                          "values unopened, so it would still name the old key",
                      v.offset);
        if (v.type == pickle::kind::global && !is_weights_only_safe_global(v.global_module(), v.global_attr()))
          unsafe.insert(v.global_name());
      }
      for (const auto& g : unsafe) result.byte_item_globals.push_back(new_name(s.fqn) + ": " + g);
    } catch (error& e) {
      // An error inside an inflated value: its offset is not the file's, so the item's is given.
      if (inflated_blob) {
        error at(e.kind(), e.message() + where, s.offset);
        at.with_file(file->name());
        throw at;
      }
      e.with_file(file->name());
      throw;
    }
  }
}

}  // namespace ckpt::dcp
