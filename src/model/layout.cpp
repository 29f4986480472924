#include "model/layout.h"

#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "ckpt/checkpoint.h"
#include "ckpt/dcp.h"
#include "ckpt/error.h"
#include "base/text.h"

namespace ckpt::detail {
namespace {

[[noreturn]] void refuse(const file_opener& fs, const std::string& path, const std::string& why,
                         errc kind = errc::unsupported) {
  throw error(kind, why).with_file(fs.display(path));
}

// A directory that is not one checkpoint is the wrong argument, as any directory was
// before layouts existed (exit 2, "not a regular file"): the user has to name a file.
[[noreturn]] void ask_for_a_file(const file_opener& fs, const std::string& path, const std::string& why) {
  refuse(fs, path, "not a regular file: a directory " + why, errc::usage);
}

// The names HuggingFaceStorageWriter gives a rank's pieces with save_distributed=True
// (`_hf_utils.py` SHARDED_FILE_NAME: `shard-{rank+1}-model-{i}-of-{N}`, each number
// zero-filled to at least 5 digits). No other writer names files so.
bool is_dcp_piece_name(const std::string& n) {
  size_t at = 0;
  auto digits = [&] {
    const size_t from = at;
    while (at < n.size() && n[at] >= '0' && n[at] <= '9') ++at;
    return at - from >= 5;
  };
  auto word = [&](const char* w) {
    const size_t len = std::char_traits<char>::length(w);
    if (n.compare(at, len, w) != 0) return false;
    at += len;
    return true;
  };
  return word("shard-") && digits() && word("-model-") && digits() && word("-of-") && digits() &&
         word(".safetensors") && at == n.size();
}

}  // namespace

bool is_shard_index_name(const std::string& name) {
  // transformers' _add_variant puts the variant before the last extension, so the
  // variant index of model.safetensors.index.json is model.safetensors.index.fp16.json.
  const size_t at = name.find(".index.");
  return at != std::string::npos && at > 0 && text::ends_with(name, ".json") && name.size() > at + 6;
}

layout detect_layout(const file_opener& fs, const std::string& path) {
  if (fs.stat(path).kind != file_kind::directory) {
    if (is_shard_index_name(text::base_name(path))) return {layout_kind::hf_index, path, {}, {}};
    return {layout_kind::single_file, path, {}, {}};
  }
  std::vector<std::string> names = fs.list(path);
  // A name no writer gives (a backslash, ...) is no checkpoint's: passed over, not refused,
  // as the user chose the directory, not the names in it.
  names.erase(std::remove_if(names.begin(), names.end(),
                             [](const std::string& n) { return !relative_name_problem(n).empty(); }),
              names.end());
  auto regular = [&](const std::string& n) { return fs.stat(text::file_in(path, n)).kind == file_kind::regular; };
  const bool global = std::binary_search(names.begin(), names.end(), std::string(".metadata")) && regular(".metadata");
  std::vector<std::string> indexes, distcp, models, safetensors;
  bool dcp_pieces = false;
  std::vector<std::pair<uint32_t, std::string>> rank_local;
  for (const std::string& n : names) {
    if (std::optional<uint32_t> r = dcp::rank_local_metadata_rank(n); r && regular(n)) rank_local.emplace_back(*r, n);
    if (is_shard_index_name(n) && regular(n)) indexes.push_back(n);
    if (text::ends_with(n, ".distcp") && regular(n)) distcp.push_back(n);
    if (text::ends_with(n, ".safetensors") && regular(n)) {
      safetensors.push_back(n);
      dcp_pieces = dcp_pieces || is_dcp_piece_name(n);
    }
    if ((n == "model.safetensors" || n == "pytorch_model.bin") && regular(n)) models.push_back(n);
  }
  const bool dcp = global || !rank_local.empty();
  if (dcp && !indexes.empty())
    ask_for_a_file(fs, path, "holding both a torch.distributed.checkpoint (" + std::string(global ? ".metadata" : rank_local.front().second) + ") and a Hugging Face shard index (" +
                                 text::join_names(indexes, 4) + "): name the file to read");
  if (dcp) {
    // dcp.load reads the global file when there is one, the rank-local ones only without
    // it (state_dict_loader.py): rank-local files beside `.metadata` are left over.
    std::vector<std::string> md{".metadata"};
    if (!global) {
      std::sort(rank_local.begin(), rank_local.end());
      md.clear();
      for (auto& [r, n] : rank_local) md.push_back(n);
    }
    return {layout_kind::dcp, path, distcp, md};
  }
  if (indexes.size() > 1)
    ask_for_a_file(fs, path, "holding " + std::to_string(indexes.size()) + " Hugging Face shard indexes (" +
                                 text::join_names(indexes, 4) + "): name the one to read");
  if (indexes.size() == 1) return {layout_kind::hf_index, text::file_in(path, indexes.front()), {}, {}};
  // HuggingFaceStorageReader reads every `*.safetensors` of the directory (hf_storage.py
  // read_metadata), whatever its name: so do we, once the writer's names say what it is.
  if (dcp_pieces) return {layout_kind::dcp_safetensors, path, safetensors, {}};
  if (models.size() > 1)
    ask_for_a_file(fs, path, "holding both model.safetensors and pytorch_model.bin: name the file to read");
  if (models.size() == 1) return {layout_kind::single_file, text::file_in(path, models.front()), {}, {}};
  ask_for_a_file(fs, path, "without a checkpoint ckptool recognizes (.metadata, *.index.json, "
                           "shard-*-model-*-of-*.safetensors, model.safetensors or pytorch_model.bin)");
}

std::string resolve_layout(const file_opener& fs, const std::string& path) {
  return detect_layout(fs, path).file;
}

std::pair<std::string, std::string> parent_and_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {"", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

}  // namespace ckpt::detail

namespace ckpt {

std::string resolve_checkpoint_path(const std::string& path) {
  // A directory is the opener's root; anything else is named in its own directory, so
  // that names read later from it (shards, chunks) resolve next to it.
  std::string root = path, name;
  struct stat st;
  const bool dir = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  if (!dir) {
    std::tie(root, name) = detail::parent_and_name(path);
    // "x/" or "a/..": not a name below a directory; the open that follows says what it is.
    // Any other file but an index is itself, whatever its name: the user typed it, so the
    // rule for names read from files does not apply to it.
    if (name.empty() || name == "." || name == ".." || !detail::is_shard_index_name(name)) return path;
  }
  const disk_opener fs(root);
  const std::string file = detail::resolve_layout(fs, name);
  // The path as the user typed it when it is the file: messages keep their words.
  return file == name ? path : fs.display(file);
}

}  // namespace ckpt
