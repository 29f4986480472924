#include "formats/hf_index.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "base/json_subset_sax.h"
#include "ckpt/error.h"
#include "ckpt/file_opener.h"

namespace ckpt::hf {

namespace {

[[noreturn]] void corrupt(const std::string& message) { throw error(errc::corrupt, message); }

// A SAX reader rather than a DOM: the weight_map keeps its file order without nlohmann's
// ordered_json (linear lookups, quadratic on 10^5 keys), a duplicate key is caught in any
// object (Python's json keeps the last of two silently, so two readers could disagree on
// which shard holds a tensor), and the limits apply while reading, not after.
class index_reader : public nlohmann::json_sax<nlohmann::json> {
 public:
  // listing: the shards only; keys are counted, not kept, and not checked for duplicates.
  index_reader(index& out, const index_limits& lim, bool listing = false) : out_(out), lim_(lim), listing_(listing) {}

  bool null() override { return scalar("null"); }
  bool boolean(bool) override { return scalar("a boolean"); }
  bool number_integer(number_integer_t) override {  // only negative ones come here
    if (in_metadata_count()) count_note("is negative");
    return scalar("a number");
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (auto* slot = in_metadata_count()) *slot = v;
    return scalar("a number");
  }
  bool number_float(number_float_t, const string_t&) override {
    if (in_metadata_count()) count_note("is not an integer");
    return scalar("a number");
  }
  bool string(string_t& s) override {
    if (top() == role::weight_map) {
      add_key(std::move(s));
      return true;
    }
    if (in_metadata_count()) count_note("is a string");
    return scalar("a string");
  }
  bool binary(binary_t&) override { return scalar("binary"); }
  bool start_object(std::size_t) override { return open(true); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    frame& f = frames_.back();
    // weight_map's keys are checked once, in by_key (renumber): one hash table, not two.
    if (f.r != role::weight_map && !f.keys.insert(k).second)
      corrupt("the key '" + k + "' appears twice in one object" + where());
    f.last_key = std::move(k);
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    // nlohmann's position counts from 1 and points just past the offending byte.
    uint64_t at = position > 0 ? position - 1 : 0;
    std::string what = e.what();
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    throw error(errc::corrupt, "index is not valid JSON: " + what, at);
  }

  void finish() {
    if (!saw_weight_map_) corrupt("index has no \"weight_map\" object");
    if (key_count_ == 0) corrupt("index \"weight_map\" names no tensors");
  }

 private:
  enum class role { root, weight_map, metadata, other };
  struct frame {
    role r;
    bool object;
    std::unordered_set<std::string> keys;
    std::string last_key;
  };

  role top() const { return frames_.empty() ? role::other : frames_.back().r; }

  // The role a value opened here plays, from its parent and the key it sits under.
  role child_role() const {
    if (frames_.empty()) return role::root;
    const frame& f = frames_.back();
    if (f.r == role::root && f.object) {
      if (f.last_key == "weight_map") return role::weight_map;
      if (f.last_key == "metadata") return role::metadata;
    }
    return role::other;
  }

  std::optional<uint64_t>* in_metadata_count() {
    if (top() != role::metadata) return nullptr;
    const std::string& k = frames_.back().last_key;
    if (k == "total_size") return &out_.total_size;
    if (k == "total_parameters") return &out_.total_parameters;
    return nullptr;
  }
  void count_note(const char* why) {
    out_.notes.push_back("metadata." + frames_.back().last_key + " " + why + ": ignored");
  }

  // A scalar where a container or a shard name belongs is corruption; anywhere else it is
  // an unknown field's value, tolerated.
  bool scalar(const char* kind) {
    if (frames_.empty()) corrupt(std::string("index is ") + kind + ", not a JSON object");
    role r = child_role();
    if (top() == role::weight_map)
      corrupt("index weight_map entry '" + frames_.back().last_key + "' is " + kind + ", not a shard file name");
    if (r == role::weight_map) corrupt(std::string("index \"weight_map\" is ") + kind + ", not an object");
    if (r == role::metadata) corrupt(std::string("index \"metadata\" is ") + kind + ", not an object");
    return true;
  }

  bool open(bool object) {
    if (frames_.size() >= kMaxDepth) throw_limit("index nests deeper than " + std::to_string(kMaxDepth) + " levels");
    role r = child_role();
    if (r == role::root && !object) corrupt("index is an array, not a JSON object");
    if (top() == role::weight_map)
      corrupt("index weight_map entry '" + frames_.back().last_key + "' is " + (object ? "an object" : "an array") +
              ", not a shard file name");
    if ((r == role::weight_map || r == role::metadata) && !object)
      corrupt(std::string("index \"") + (r == role::weight_map ? "weight_map" : "metadata") +
              "\" is an array, not an object");
    if (r == role::weight_map) saw_weight_map_ = true;
    if (r == role::metadata) out_.has_metadata = true;
    frames_.push_back({r, object, {}, {}});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return true;
  }

  std::string where() const {
    switch (top()) {
      case role::weight_map: return " (weight_map)";
      case role::metadata: return " (metadata)";
      default: return "";
    }
  }

  void add_key(std::string shard) {
    const std::string& key = frames_.back().last_key;
    if (key_count_ >= lim_.max_keys)
      throw_limit("index names more than " + std::to_string(lim_.max_keys) + " tensors");
    if (shard.size() > lim_.max_name)
      throw_limit("index weight_map entry '" + key + "' has a shard name longer than " +
                  std::to_string(lim_.max_name) + " bytes");
    // Writers put runs of consecutive keys in one shard: the last shard's id is the usual answer.
    uint32_t id;
    if (last_shard_ && *last_shard_ == shard) {
      id = last_id_;
    } else {
      if (std::string why = relative_name_problem(shard); !why.empty())
        throw error(errc::unsafe, "index weight_map entry '" + key + "' names shard '" + shard +
                                      "', which " + why + ": shards must lie inside the index's directory");
      auto [it, fresh] = shard_ids_.try_emplace(std::move(shard), uint32_t(shard_ids_.size()));
      if (fresh && shard_ids_.size() > lim_.max_shards)
        throw_limit("index names more than " + std::to_string(lim_.max_shards) + " shard files");
      last_shard_ = &it->first;
      id = last_id_ = it->second;
    }
    ++key_count_;
    if (!listing_) out_.keys.emplace_back(key, id);
  }

 public:
  // Shard ids are given in order of first appearance while reading; the public order is
  // sorted by name, as the loaders open them.
  void renumber() {
    std::vector<uint32_t> to_sorted(shard_ids_.size());
    out_.shards.reserve(shard_ids_.size());
    for (const auto& [name, id] : shard_ids_) {  // std::map: already sorted
      to_sorted[id] = uint32_t(out_.shards.size());
      out_.shards.push_back(name);
    }
    // Built once `keys` has stopped growing: a short key lives inside its std::string,
    // which moves when the vector reallocates.
    if (listing_) return;
    out_.by_key.reserve(out_.keys.size());
    for (auto& [key, id] : out_.keys) {
      id = to_sorted[id];
      if (!out_.by_key.try_emplace(key, id).second)
        corrupt("the key '" + key + "' appears twice in one object (weight_map)");
    }
  }

 private:
  static constexpr size_t kMaxDepth = 256;
  index& out_;
  const index_limits& lim_;
  const bool listing_;
  size_t key_count_ = 0;
  std::vector<frame> frames_;
  std::map<std::string, uint32_t> shard_ids_;
  const std::string* last_shard_ = nullptr;  // a key of shard_ids_ (std::map: stable)
  uint32_t last_id_ = 0;
  bool saw_weight_map_ = false;
};

std::string_view extension(std::string_view name) {
  size_t slash = name.find_last_of('/');
  size_t dot = name.find_last_of('.');
  if (dot == std::string_view::npos || (slash != std::string_view::npos && dot < slash)) return {};
  return name.substr(dot);
}

}  // namespace

const std::string* index::shard_of(std::string_view key) const {
  auto it = by_key.find(key);
  return it == by_key.end() ? nullptr : &shards[it->second];
}

namespace {

index parse(std::string_view text, const index_limits& limits, bool listing) {
  if (text.size() > limits.max_bytes)
    throw_limit("index is " + std::to_string(text.size()) + " bytes, over the limit of " +
                std::to_string(limits.max_bytes));
  auto read = [&](bool subset) -> std::optional<index> {
    index out;
    // About 60 bytes of text per entry in real indexes; a guess, bounded, saves the regrowth.
    if (!listing) out.keys.reserve(std::min<uint64_t>({text.size() / 64, limits.max_keys, uint64_t(1) << 20}));
    index_reader reader(out, limits, listing);
    // The writers' JSON through the quick reader (formats.md §6.2); anything else, or
    // anything it doubts, from the start again through nlohmann's parser.
    if (subset) {
      if (!detail::json_subset_sax(text, reader)) return std::nullopt;
    } else {
      nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &reader);
    }
    reader.finish();
    reader.renumber();
    return out;
  };
  if (std::optional<index> quick = read(true)) return std::move(*quick);
  return std::move(*read(false));
}

}  // namespace

index parse_index(std::string_view text, const index_limits& limits) { return parse(text, limits, false); }

index parse_index_shards(std::string_view text, const index_limits& limits) { return parse(text, limits, true); }

size_t cross_check_result::errors() const {
  return size_t(std::count_if(findings.begin(), findings.end(), [](const finding& f) { return f.error; }));
}

cross_check_result cross_check(const index& idx, const std::vector<shard_contents>& shards) {
  cross_check_result r;
  auto add = [&](finding::what kind, bool error, std::string key, std::string shard, std::string other,
                 std::string message) {
    r.findings.push_back({kind, error, std::move(key), std::move(shard), std::move(other), std::move(message)});
  };

  std::unordered_map<std::string_view, const shard_contents*> by_name;
  for (const auto& s : shards) by_name.emplace(s.name, &s);
  std::vector<const shard_contents*> of_index(idx.shards.size(), nullptr);  // nullptr: missing
  std::vector<size_t> keys_per_shard(idx.shards.size(), 0);
  for (const auto& [key, id] : idx.keys) keys_per_shard[id]++;
  for (size_t i = 0; i < idx.shards.size(); ++i) {
    auto it = by_name.find(idx.shards[i]);
    if (it != by_name.end() && it->second->present) {
      of_index[i] = it->second;
      continue;
    }
    add(finding::what::missing_shard, true, "", idx.shards[i], "",
        "shard '" + idx.shards[i] + "' (" + std::to_string(keys_per_shard[i]) +
            " tensors in the index) does not exist");
  }

  // Which of the index's shards hold each key: the first holder, and a second if any.
  struct holders {
    uint32_t first;
    std::optional<uint32_t> second;
  };
  std::unordered_map<std::string_view, holders> held;
  for (uint32_t i = 0; i < of_index.size(); ++i) {
    if (!of_index[i]) continue;
    for (const std::string& key : of_index[i]->keys) {
      auto [it, fresh] = held.try_emplace(key, holders{i, std::nullopt});
      if (!fresh && it->second.first != i && !it->second.second) it->second.second = i;
    }
  }

  for (const auto& [key, id] : idx.keys) {
    if (!of_index[id]) continue;  // reported once, as a missing shard
    auto it = held.find(key);
    bool in_own = it != held.end() && (it->second.first == id || it->second.second == id);
    if (!in_own)
      add(finding::what::key_missing_from_shard, true, key, idx.shards[id], "",
          "tensor '" + key + "' is in the index under shard '" + idx.shards[id] + "', which does not hold it");
    if (it != held.end() && it->second.second) {
      uint32_t other = it->second.first == id ? *it->second.second : it->second.first;
      add(finding::what::key_in_two_shards, true, key, idx.shards[id], idx.shards[other],
          "tensor '" + key + "' is held by shard '" + idx.shards[id] + "' (the index's) and by shard '" +
              idx.shards[other] + "': a loader may take either copy");
    }
  }
  // Keys the index omits, in shard order then the shard's own order.
  for (uint32_t i = 0; i < of_index.size(); ++i) {
    if (!of_index[i]) continue;
    for (const std::string& key : of_index[i]->keys) {
      if (idx.by_key.count(key)) continue;
      const holders& h = held.at(key);
      if (h.second && h.first == i) {
        add(finding::what::key_in_two_shards, true, key, idx.shards[i], idx.shards[*h.second],
            "tensor '" + key + "' is held by shards '" + idx.shards[i] + "' and '" + idx.shards[*h.second] +
                "' and the index names neither: a loader may take either copy");
      } else if (!h.second) {
        add(finding::what::key_not_in_index, false, key, idx.shards[i], "",
            "tensor '" + key + "' in shard '" + idx.shards[i] +
                "' is not in the index (transformers and accelerate load it anyway)");
      }
    }
  }

  std::unordered_set<std::string_view> named(idx.shards.begin(), idx.shards.end());
  for (const auto& s : shards)
    if (s.present && !named.count(s.name))
      add(finding::what::orphan_shard, false, "", s.name, "",
          "shard file '" + s.name + "' is beside the index but no tensor points to it (loaders ignore it)");

  bool all_present = std::all_of(of_index.begin(), of_index.end(), [](const shard_contents* s) { return s; });
  if (!idx.total_size) {
    add(finding::what::no_total_size, false, "", "", "",
        idx.has_metadata ? "index metadata has no total_size (informational only: no loader reads it)"
                         : "index has no \"metadata\" (transformers' from_pretrained refuses it; "
                           "huggingface_hub and accelerate load it)");
  } else if (all_present) {
    uint64_t sum = 0;
    for (const auto* s : of_index) sum += s->bytes;
    if (sum != *idx.total_size)
      add(finding::what::total_size_mismatch, false, "", "", "",
          "index metadata.total_size is " + std::to_string(*idx.total_size) + " bytes, the shards hold " +
              std::to_string(sum) + " (informational only: no loader checks it)");
  }
  return r;
}

std::vector<std::string> orphan_candidates(const index& idx, const std::vector<std::string>& listing) {
  std::unordered_set<std::string_view> exts;
  for (const auto& s : idx.shards)
    if (auto e = extension(s); !e.empty()) exts.insert(e);
  std::unordered_set<std::string_view> named(idx.shards.begin(), idx.shards.end());
  std::vector<std::string> out;
  for (const auto& f : listing) {
    if (named.count(f) || !exts.count(extension(f))) continue;
    if (f.size() >= 11 && f.compare(f.size() - 11, 11, ".index.json") == 0) continue;
    out.push_back(f);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ckpt::hf
