// rekey of a Hugging Face shard set (formats.md §10, §11.2): one plan over every key of
// every shard, each shard rewritten by rekey_file under its own name, the index last.
#include <sys/stat.h>
#include <unistd.h>

#include <iterator>
#include <map>
#include <set>

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "base/ordered_json.h"
#include "ckpt/error.h"
#include "ckpt/file_opener.h"
#include "ckpt/input_file.h"
#include "ckpt/output_set.h"
#include "ckpt/rekey_set.h"
#include "ckpt/sys_io.h"
#include "formats/hf_index.h"
#include "base/text.h"

namespace ckpt {
namespace {

// Python's json.dumps(sort_keys=True) orders keys by code point, which is UTF-8 byte order.
bool sorted_everywhere(const nlohmann::ordered_json& j) {
  if (j.is_array()) {
    for (const auto& v : j)
      if (!sorted_everywhere(v)) return false;
    return true;
  }
  if (!j.is_object()) return true;
  const std::string* previous = nullptr;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (previous && !(*previous < it.key())) return false;
    previous = &it.key();
    if (!sorted_everywhere(it.value())) return false;
  }
  return true;
}

struct shard_input {
  std::string name, path;
  std::vector<std::string> keys;
  uint64_t size = 0;
  bool changes = false;  // a key renamed, a mirror or _metadata path renamed, an entry dropped
};

}  // namespace

std::string renamed_index_text(const std::string& text, const std::function<std::string(const std::string&)>& rename) {
  // 200 levels: the index's `metadata` is free-form, and the walks below recurse.
  nlohmann::ordered_json in = detail::parse_ordered_json(text, 200, [](const detail::json_failure& f) {
    throw error(errc::corrupt, "the index does not parse as JSON: " + f.what);
  });
  // transformers sorts and ends with a newline, huggingface_hub does neither: a hub index
  // whose keys happen to be sorted must keep its (state-dict) order after the renaming.
  const bool ends_with_newline = !text.empty() && text.back() == '\n';
  const bool sorted = ends_with_newline && sorted_everywhere(in);
  detail::ordered_object_builder top;
  for (auto it = in.begin(); it != in.end(); ++it) {
    if (it.key() != "weight_map") {
      top.set(it.key(), it.value());  // `metadata` and anything else, exactly
      continue;
    }
    detail::ordered_object_builder map;
    for (auto kv = it.value().begin(); kv != it.value().end(); ++kv) map.set(rename(kv.key()), kv.value());
    top.set("weight_map", map.take());
  }
  const nlohmann::ordered_json out = top.take();
  // Both writers call json with indent=2 and Python's default ensure_ascii=True.
  if (sorted) return nlohmann::json(out).dump(2, ' ', true) + "\n";
  return out.dump(2, ' ', true) + (ends_with_newline ? "\n" : "");
}

namespace {

hf::index read_index(const std::string& index_path, std::string* text_out) {
  const hf::index_limits limits;
  std::string text = read_text_input(index_path, limits.max_bytes);
  try {
    hf::index idx = hf::parse_index(text, limits);
    if (text_out) *text_out = std::move(text);
    return idx;
  } catch (error& e) {
    e.with_file(index_path);
    throw;
  }
}

}  // namespace

std::vector<keyed_tensor> hf_set_keyed_tensors(const std::string& index_path, const open_options& reader) {
  const hf::index idx = read_index(index_path, nullptr);
  const std::string dir = text::parent_directory(index_path);
  std::vector<keyed_tensor> out;
  for (const std::string& name : idx.shards) {
    checkpoint c = open_checkpoint(dir + "/" + name, reader);
    std::vector<keyed_tensor> one = keyed_tensors(c);
    out.insert(out.end(), std::make_move_iterator(one.begin()), std::make_move_iterator(one.end()));
  }
  return out;
}

rekey_set_result rekey_hf_set(const std::string& index_path, output_dir* out, const rekey_set_request& req) {
  rekey_set_result result;
  std::string text;
  const hf::index idx = read_index(index_path, &text);
  const std::string dir = text::parent_directory(index_path);
  result.index = text::base_name(index_path);

  // Every shard's keys, one shard open at a time; then the index is checked against them.
  std::vector<shard_input> shards;
  std::vector<hf::shard_contents> contents;
  uint64_t total = 0;
  for (const std::string& name : idx.shards) {
    if (name.find('/') != std::string::npos || name.find('\\') != std::string::npos)
      throw error(errc::unsupported, "shard " + name +
                                         " lies in a subdirectory; rekey -o writes a set of plain file names")
          .with_file(index_path);
    shard_input s;
    s.name = name;
    s.path = dir + "/" + name;
    struct stat st;
    if (::stat(s.path.c_str(), &st) != 0) {
      contents.push_back({name, false, {}, 0});
      continue;
    }
    // A dry run of the shard: every refusal rekey_file would make (TorchScript, unsafe
    // globals, a collision inside it) comes before anything is written.
    checkpoint c = open_checkpoint(s.path, req.reader);
    rekey_request dry;
    dry.ops = req.ops;
    dry.unsafe = req.unsafe;
    dry.dry_run = true;
    dry.reader = req.reader;
    rekey_result planned = rekey_file(c, dry);
    s.keys.reserve(planned.plan.mapping.size());
    s.changes = planned.plan.changed > 0 || !planned.dropped.empty();
    for (auto& [from, to] : planned.plan.mapping) s.keys.push_back(std::move(from));
    if (req.dry_run) {
      for (const auto& m : planned.mirrored_dicts) result.mirrored_dicts.push_back(name + ": " + m);
      for (const auto& d : planned.dropped) result.dropped.push_back(name + ": " + d);
    }
    s.size = uint64_t(st.st_size);
    total += s.size;
    contents.push_back({name, true, s.keys, 0});
    shards.push_back(std::move(s));
  }
  const hf::cross_check_result check = hf::cross_check(idx, contents);
  std::vector<std::string> errors;
  for (const auto& f : check.findings) {
    // The shards' bytes were not counted (contents[].bytes is 0); rekey keeps them, and
    // metadata.total_size with them, as they are.
    if (f.kind == hf::finding::what::total_size_mismatch) continue;
    (f.error ? errors : result.notes).push_back(f.message);
  }
  if (!errors.empty())
    throw error(errc::corrupt, std::to_string(errors.size()) + " disagreement(s) between the index and its shards; " +
                                   "nothing written: " + text::join_names(errors, 3))
        .with_file(index_path);

  // One plan over every key: a collision between two shards is as fatal as one inside one.
  std::vector<std::string> all;
  for (const auto& s : shards) all.insert(all.end(), s.keys.begin(), s.keys.end());
  result.plan = plan_rekey(std::move(all), req.ops);
  if (!result.plan.emptied.empty())
    throw error(errc::check_failed, std::to_string(result.plan.emptied.size()) +
                                        " key(s) would be renamed to the empty string; nothing written: " +
                                        text::join_names(result.plan.emptied, 5))
        .with_file(index_path);
  if (!result.plan.collisions.empty()) {
    std::vector<std::string> lines;
    for (auto& [to, from] : result.plan.collisions) lines.push_back("'" + to + "' <- " + text::join_names(from, 4));
    throw error(errc::check_failed, std::to_string(result.plan.collisions.size()) +
                                        " new key(s) would be claimed by several keys across the shards; nothing "
                                        "written: " +
                                        text::join_names(lines, 5))
        .with_file(index_path);
  }
  std::unordered_map<std::string, std::string> renamed;
  renamed.reserve(result.plan.mapping.size());
  for (const auto& [from, to] : result.plan.mapping) renamed.emplace(from, to);
  const auto rename = [&renamed](const std::string& k) {
    auto it = renamed.find(k);
    return it == renamed.end() ? k : it->second;
  };
  // Made before anything is written: an index that will not re-serialize stops here.
  std::string new_index;
  try {
    new_index = renamed_index_text(text, rename);
  } catch (error& e) {
    e.with_file(index_path);
    throw;
  }
  for (const auto& s : shards) result.files.push_back(s.name);
  result.files.push_back(result.index);
  {
    const disk_opener fs(dir);
    const std::set<std::string> own(result.files.begin(), result.files.end());
    for (const std::string& n : fs.list(""))
      if (!own.count(n) && fs.stat(n).kind == file_kind::regular) result.left_behind.push_back(n);
  }
  if (req.dry_run) return result;
  if (!out) throw error(errc::usage, "rekey: no output directory given").with_file(index_path);

  out->add_input_dir(dir);
  out->add_input(index_path);
  for (const auto& s : shards) out->add_input(s.path);
  out->open(result.files, result.index);

  uint64_t done = 0;
  for (const auto& s : shards) {
    output_set set;
    set.set_staged();
    const file_fingerprint fp = set.add_input(s.path);
    output_file& o = set.add_output(out->staged(s.name), fp.mode & 0777);
    set.open();
    if (!s.changes) {
      // Nothing in it changes (no key, so no mirror or _metadata path either): the file
      // is copied byte for byte.
      const int fd = open_regular_input(s.path);
      try {
        copy_range(fd, s.path, 0, s.size, o.fd(), o.path(), [&](uint64_t d) {
          o.start_writeback(d);
          if (req.progress) req.progress(done + d, total);
        });
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
      set.commit();
      done += s.size;
      result.bytes_written += s.size;
      continue;
    }
    checkpoint c = open_checkpoint(s.path, req.reader);
    rekey_request r;
    r.ops = req.ops;
    r.unsafe = req.unsafe;
    r.reader = req.reader;
    r.output = &o;
    r.release_input = true;
    if (req.progress) r.progress = [&](uint64_t d, uint64_t) { req.progress(done + d, total); };
    rekey_result one = rekey_file(c, r);
    set.commit();
    done += s.size;
    result.bytes_written += one.bytes_written;
    result.metadata_renamed += one.metadata_renamed;
    for (const auto& m : one.mirrored_dicts) result.mirrored_dicts.push_back(s.name + ": " + m);
    for (const auto& d : one.dropped) result.dropped.push_back(s.name + ": " + d);
  }

  // A rewritten shard's size differs from its input's by its header: end on the total.
  if (req.progress) req.progress(total, total);

  output_set set;
  set.set_staged();
  const file_fingerprint fp = set.add_input(index_path);
  output_file& o = set.add_output(out->staged(result.index), fp.mode & 0777);
  set.open();
  o.write(new_index.data(), new_index.size());
  set.commit();
  result.bytes_written += new_index.size();
  return result;
}

}  // namespace ckpt
