// The entry points of ckpt/convert.h past planning: which writer, which metadata, and for
// a shard set, which tensors go in which file (formats.md §10.5, §13.2).
#include "ckpt/convert.h"

#include <nlohmann/json.hpp>

#include "ckpt/error.h"
#include "convert/convert_writers.h"
#include "formats/hf_shard_plan.h"

namespace ckpt {
namespace {

using detail::metadata_pairs;

// dict.update: a key already there keeps its place and takes the new value.
void update(metadata_pairs& into, const metadata_pairs& from) {
  for (const auto& kv : from) {
    auto it = std::find_if(into.begin(), into.end(), [&](const auto& x) { return x.first == kv.first; });
    if (it == into.end())
      into.push_back(kv);
    else
      it->second = kv.second;
  }
}

// What save_torch_state_dict's caller passes as `metadata`: the input's own entries
// besides "format", which the Hub adds itself, and the ties' aliases.
metadata_pairs hub_metadata(const convert_plan& plan) {
  metadata_pairs out;
  for (const auto& kv : plan.metadata)
    if (kv.first != "format") out.push_back(kv);
  return out;
}

std::vector<size_t> written_tensors(const convert_plan& plan) {
  std::vector<size_t> out;
  for (size_t i = 0; i < plan.tensors.size(); ++i)
    if (!plan.tensors[i].tie_of) out.push_back(i);
  return out;
}

hf::shard_plan shard_plan_of(const convert_plan& plan, const std::vector<size_t>& written, uint64_t max_shard_size) {
  std::vector<hf::shard_tensor> shard_tensors;
  shard_tensors.reserve(written.size());
  for (size_t i : written) {
    const convert_tensor& t = plan.tensors[i];
    // Each written tensor is a storage of its own; the Hub gives every empty storage one id.
    shard_tensors.push_back({t.name, t.nbytes ? uint64_t(i) : UINT64_MAX, t.nbytes});
  }
  return hf::plan_shards(shard_tensors, max_shard_size);
}

const char* kIndexName = "model.safetensors.index.json";

}  // namespace

convert_result write_converted_file(const checkpoint& c, const convert_plan& plan, output_file& out,
                                    const convert_request& request) {
  convert_result result;
  const auto on_data = [&](uint64_t done) {
    if (request.progress) request.progress(done, plan.data_bytes);
  };
  if (plan.to == convert_target::torch) {
    result.bytes_written = detail::write_torch_file(c, plan, out, request, on_data);
  } else if (plan.to == convert_target::safetensors) {
    std::optional<metadata_pairs> metadata;
    if (plan.from_safetensors) {
      if (!plan.metadata.empty()) metadata = plan.metadata;
    } else {
      metadata = metadata_pairs{{"format", "pt"}};
      update(*metadata, plan.metadata);
    }
    result.bytes_written =
        detail::write_safetensors_file(c, plan, written_tensors(plan), metadata, out, request, on_data);
  } else {
    throw error(errc::usage, "a shard set is written with write_converted_hf_set");
  }
  result.files.push_back(out.path());
  return result;
}

std::vector<std::string> hf_set_files(const convert_plan& plan, uint64_t max_shard_size) {
  const hf::shard_plan shards = shard_plan_of(plan, written_tensors(plan), max_shard_size);
  std::vector<std::string> files = shards.files;
  if (shards.is_sharded()) files.push_back(kIndexName);
  return files;
}

convert_result write_converted_hf_set(const checkpoint& c, const convert_plan& plan, output_dir& out,
                                      const convert_request& request) {
  return detail::write_hf_set_files(c, plan, out.staging_directory(), {}, request);
}

std::vector<uint64_t> detail::hf_set_file_bytes(const convert_plan& plan, uint64_t max_shard_size) {
  const std::vector<size_t> written = written_tensors(plan);
  const hf::shard_plan shards = shard_plan_of(plan, written, max_shard_size);
  std::vector<uint64_t> out;
  for (const auto& tensors : shards.file_tensors) {
    uint64_t bytes = 0;
    for (size_t k : tensors) bytes += plan.tensors[written[k]].nbytes;
    out.push_back(bytes);
  }
  if (shards.is_sharded()) out.push_back(0);  // the index: a few bytes per key
  return out;
}

convert_result detail::write_hf_set_files(const checkpoint& c, const convert_plan& plan, const std::string& directory,
                                          const std::vector<bool>& mine, const convert_request& request) {
  const std::vector<size_t> written = written_tensors(plan);
  const hf::shard_plan shards = shard_plan_of(plan, written, request.max_shard_size);
  const auto is_mine = [&](size_t f) { return mine.empty() || (f < mine.size() && mine[f]); };
  // save_torch_state_dict: "format": "pt" in every shard, the caller's metadata too when
  // there is one shard, else in the index beside total_size.
  const metadata_pairs extra = hub_metadata(plan);
  metadata_pairs per_file{{"format", "pt"}};
  if (!shards.is_sharded()) update(per_file, extra);

  // Progress counts the files written here.
  uint64_t total = 0;
  for (size_t f = 0; f < shards.files.size(); ++f)
    if (is_mine(f))
      for (size_t k : shards.file_tensors[f]) total += plan.tensors[written[k]].nbytes;

  convert_result result;
  uint64_t base = 0;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t f = 0; f < shards.files.size(); ++f) {
    std::vector<size_t> indices;
    for (size_t k : shards.file_tensors[f]) {
      indices.push_back(written[k]);
      weight_map[plan.tensors[written[k]].name] = shards.files[f];
    }
    if (!is_mine(f)) continue;
    output_set set;
    set.set_staged();
    output_file& o = set.add_output(directory + "/" + shards.files[f]);
    set.open();
    uint64_t shard_bytes = 0;
    result.bytes_written += detail::write_safetensors_file(c, plan, indices, per_file, o, request, [&](uint64_t done) {
      shard_bytes = done;
      if (request.progress) request.progress(base + done, total);
    });
    set.commit();
    base += shard_bytes;
    result.files.push_back(shards.files[f]);
  }
  if (shards.is_sharded() && is_mine(shards.files.size())) {
    nlohmann::ordered_json index = nlohmann::ordered_json::object();
    nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
    metadata["total_size"] = shards.total_size;
    for (const auto& [k, v] : extra) metadata[k] = v;
    index["metadata"] = std::move(metadata);
    index["weight_map"] = std::move(weight_map);
    // json.dump(index, f, indent=2): Python's separators, ASCII escapes, no final newline.
    const std::string text = index.dump(2, ' ', true);
    output_set set;
    set.set_staged();
    output_file& o = set.add_output(directory + "/" + kIndexName);
    set.open();
    o.write(text.data(), text.size());
    set.commit();
    result.bytes_written += text.size();
    result.files.push_back(kIndexName);
  }
  return result;
}

}  // namespace ckpt
