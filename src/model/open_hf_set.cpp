#include "model/open_hf_set.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "ckpt/error.h"
#include "formats/format_detect.h"
#include "formats/dcp_sharding_info.h"
#include "formats/hf_index.h"
#include "base/text.h"

namespace ckpt::detail {
namespace {

// Shard names are relative to the index's directory (formats.md §10.1).
std::string parent_of(const std::string& relative) {
  const size_t slash = relative.rfind('/');
  return slash == std::string::npos ? std::string() : relative.substr(0, slash);
}

struct read_index_result {
  hf::index idx;
  uint64_t bytes_read = 0;
};

read_index_result read_index(const file_opener& fs, const std::string& index, bool shards_only = false) {
  const hf::index_limits lim;
  read_index_result r;
  try {
    std::unique_ptr<byte_source> src = fs.open(index);
    // Read no more of a hostile file than the limit lets parse_index accept.
    const uint64_t n = std::min<uint64_t>(src->size(), lim.max_bytes + 1);
    const std::vector<uint8_t> text = src->read_vector(0, size_t(n));
    r.bytes_read = src->bytes_read();
    const std::string_view json(reinterpret_cast<const char*>(text.data()), text.size());
    r.idx = shards_only ? hf::parse_index_shards(json, lim) : hf::parse_index(json, lim);
  } catch (error& e) {
    e.with_file(fs.display(index));
    throw;
  }
  return r;
}

// A shard must be what the loaders would read it as, or ckptool's reading of it is not
// theirs: transformers and huggingface_hub pick the reader by the shard's name
// (safe_load_file for ".safetensors", else torch.load(weights_only=True)) and take the
// whole of what it returns as state-dict entries.
// A shard the loaders fail on makes the set corrupt (verify lists it as a problem); one
// they would read, but not as ckptool can vouch for, is unsupported.
void check_shard(const checkpoint& s, const std::string& name, const std::string& shown) {
  auto broken = [&](const std::string& why) { throw error(errc::corrupt, why).with_file(shown); };
  auto refuse = [&](const std::string& why) { throw error(errc::unsupported, why).with_file(shown); };
  if (s.format == file_format::torchscript)
    broken("a TorchScript archive as a shard of a Hugging Face set: no loader of shard sets reads one");
  if (s.format == file_format::pt2)
    broken("a torch.export archive as a shard of a Hugging Face set: no loader of shard sets reads one");
  if (s.format == file_format::torch_legacy)
    refuse("a legacy (pre-1.6) torch.save stream as a shard of a Hugging Face set: no shard writer writes one, "
           "so it is not read as one");
  const bool named_safetensors = text::ends_with(name, ".safetensors");
  if (named_safetensors != (s.format == file_format::safetensors))
    broken(std::string("a ") + format_name(s.format) + " file under a name the loaders read as " +
           (named_safetensors ? "safetensors" : "a torch.save file") + " (they choose the reader by the name)");
  if (s.format == file_format::torch_zip) {
    // torch.load(weights_only=True), as the loaders call it, refuses the module's class.
    if (!s.module_class.empty()) broken("a pickled nn.Module as a shard, not a {key: tensor} dict");
    if (!s.state_dict || !s.state_dict->empty())
      refuse("a shard that is not a flat {key: tensor} dict: the loaders would take its top-level entries as keys");
    if (!s.entries.empty())
      refuse("a shard holding non-tensor entries ('" + path_to_string(s.entries.front().path) +
             "', ...): no shard writer writes them");
  }
}

std::shared_ptr<const tensor_record> shifted(const std::shared_ptr<const tensor_record>& t, size_t base);

// A record moved into the merged checkpoint: its storage indices (its own, its quantizer's
// channel tensors', its components') follow the storages appended before it.
void shift_storages(tensor_record& t, size_t base) {
  if (t.storage) *t.storage += base;
  if (t.quant && (t.quant->scales || t.quant->zero_points)) {
    auto q = std::make_shared<quantization>(*t.quant);
    q->scales = shifted(q->scales, base);
    q->zero_points = shifted(q->zero_points, base);
    t.quant = std::move(q);
  }
  if (t.kind && !t.kind->components.empty()) {
    auto k = std::make_shared<tensor_kind>(*t.kind);
    for (auto& part : k->components) part.second = shifted(part.second, base);
    t.kind = std::move(k);
  }
}

std::shared_ptr<const tensor_record> shifted(const std::shared_ptr<const tensor_record>& t, size_t base) {
  if (!t) return t;
  auto copy = std::make_shared<tensor_record>(*t);
  shift_storages(*copy, base);
  return copy;
}

void append_shard(checkpoint& set, checkpoint&& shard, const std::string& name, std::set<std::string>& globals,
                  std::set<std::string>& unsafe) {
  const uint32_t file = uint32_t(set.files.size());
  const size_t storage_base = set.storages.size(), tensor_base = set.tensors.size();
  set.files.push_back(std::move(shard.files.front()));
  for (storage_record& s : shard.storages) {
    s.file = file;
    set.storages.push_back(std::move(s));
  }
  for (tensor_record& t : shard.tensors) {
    if (storage_base) shift_storages(t, storage_base);
    set.tensors.push_back(std::move(t));
  }
  for (tensor_alias& a : shard.aliases) {
    a.tensor += tensor_base;
    set.aliases.push_back(std::move(a));
  }
  for (size_t k = 0; k < shard.keys.size(); ++k) set.keys.add(shard.keys.key(k), shard.keys.tensor(k) + tensor_base);
  globals.insert(shard.globals.begin(), shard.globals.end());
  unsafe.insert(shard.unsafe_globals.begin(), shard.unsafe_globals.end());
  for (const std::string& r : shard.unknown_records) set.unknown_records.push_back(name + ": " + r);
}

// Errors of the cross-check refuse the set in one line, naming the index: the index is
// what says where each tensor is, and each message names the shards it is about.
[[noreturn]] void refuse_findings(const std::vector<const hf::finding*>& errors, const std::string& shown_index) {
  std::string line = errors.front()->message;
  if (errors.size() > 1)
    line += " (and " + std::to_string(errors.size() - 1) + " more problem" + (errors.size() > 2 ? "s" : "") + ")";
  throw error(errc::corrupt, line).with_file(shown_index);
}

std::vector<const hf::finding*> errors_of(const hf::cross_check_result& r, bool missing_shards_only = false) {
  std::vector<const hf::finding*> out;
  for (const hf::finding& f : r.findings)
    if (f.error && (!missing_shards_only || f.kind == hf::finding::what::missing_shard)) out.push_back(&f);
  return out;
}

// A shard opened ahead of its turn: its checkpoint, or what opening it threw.
struct ahead_shard {
  std::optional<checkpoint> shard;
  std::exception_ptr failure;
};

size_t reader_threads() {
  // Under an address-space limit (ulimit -v) each thread's stack and malloc arena count
  // against it: a set that opens with one thread must not fail with several.
  struct rlimit as {};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) return 1;
  return std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 4);
}

// Opens the shards on up to four threads when every one is a safetensors file (a header
// and tables built from it: no state shared with another shard's reading); empty when that
// is not worth it or not the case, and the caller opens each in turn. A shard that does
// not start as safetensors is left for the caller too.
template <class Open>
std::vector<ahead_shard> read_ahead(const file_opener& fs, const std::string& dir, const std::vector<std::string>& names,
                                    uint64_t max_tensors, Open& open_shard) {
  const size_t threads = std::min(reader_threads(), names.size());
  if (threads < 2) return {};
  for (const std::string& n : names)
    if (!text::ends_with(n, ".safetensors")) return {};
  std::vector<ahead_shard> out(names.size());
  std::atomic<size_t> next{0};
  // A hostile set of many full shards: reading ahead stops once what was read passes the
  // tensor limit (the caller refuses the set at that shard), so it holds at most a few
  // shards more than reading in turn would.
  std::atomic<uint64_t> tensors{0};
  auto work = [&] {
    for (size_t i; tensors.load() <= max_tensors && (i = next.fetch_add(1)) < names.size();) {
      bool safetensors = false;
      try {
        safetensors = sniff_format(*fs.open(text::file_in(dir, names[i]))) == sniffed::safetensors;
      } catch (...) {  // the caller opens it in turn, and reports what it finds then
      }
      if (!safetensors) continue;
      try {
        out[i].shard.emplace(open_shard(i));
        tensors += out[i].shard->tensors.size();
      } catch (...) {
        out[i].failure = std::current_exception();
      }
    }
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {  // no thread to be had: the others share the work
      break;
    }
  }
  work();
  for (auto& h : helpers) h.join();
  return out;
}

// A set written by DCP's HuggingFaceStorageWriter(save_distributed=False) (formats.md
// §9.10) is read by two loaders that disagree when a tensor is a box of a larger one:
// transformers takes each shard's tensors whole, HuggingFaceStorageReader places them at
// DCP_SHARDING_INFO's offsets. They agree only when every box is at offset 0 and is the
// whole tensor; the index's total_size (every rank's bytes) is what shows the second.
void check_dcp_written(const std::vector<checkpoint>& shards, const std::vector<hf::shard_contents>& contents,
                       const hf::index& idx, const file_opener& fs, const std::string& dir,
                       const std::string& shown_index) {
  bool dcp_written = false;
  uint64_t bytes = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    bytes += contents[i].bytes;
    const source_file& f = shards[i].files.front();
    if (!f.st_header) continue;
    const auto text = dcp::metadata_value(f.st_header->metadata, dcp::kShardingInfoKey);
    if (!text) continue;
    dcp_written = true;
    const std::string shown = fs.display(text::file_in(dir, idx.shards[i]));
    dcp::sharding_info info;
    try {
      info = dcp::parse_sharding_info(*text);
    } catch (error& e) {
      e.with_file(shown);
      throw;
    }
    for (const auto& [fqn, offsets] : info.offsets)
      if (std::any_of(offsets.begin(), offsets.end(), [](int64_t o) { return o != 0; }))
        throw error(errc::unsupported,
                    "tensor '" + fqn + "' is a box at nonzero offsets of a larger tensor (__metadata__ " +
                        dcp::kShardingInfoKey + "): transformers would read the box as the whole tensor, "
                        "HuggingFaceStorageReader would not; no single reading is exact")
            .with_file(shown);
  }
  if (dcp_written && idx.total_size && *idx.total_size != bytes)
    throw error(errc::corrupt, "metadata.total_size is " + std::to_string(*idx.total_size) + " bytes but the shards hold " +
                                   std::to_string(bytes) + ": HuggingFaceStorageWriter counts every rank's pieces, so "
                                   "pieces are missing (several processes saving with save_distributed=False write "
                                   "one file name over each other)")
        .with_file(shown_index);
}

}  // namespace

std::vector<std::string> hf_set_files(const file_opener& fs, const std::string& index) {
  // The set's reader parses the index again, whole: here only the shards are wanted.
  const read_index_result r = read_index(fs, index, true);
  const std::string dir = parent_of(index);
  std::vector<std::string> out{fs.display(index)};
  for (const std::string& shard : r.idx.shards)
    if (fs.stat(text::file_in(dir, shard)).kind == file_kind::regular) out.push_back(fs.display(text::file_in(dir, shard)));
  return out;
}

checkpoint open_hf_set(const file_opener& fs, const std::string& index, const open_options& given) {
  // The shards are read as models whatever the caller's purpose: the set is merged from them.
  open_options options = given;
  options.intent = open_options::purpose::read;
  const std::string shown_index = fs.display(index);
  read_index_result r = read_index(fs, index);
  const hf::index& idx = r.idx;
  const std::string dir = parent_of(index);

  // Every shard the index names must exist before any is read: the loaders stop there too.
  std::vector<hf::shard_contents> contents(idx.shards.size());
  bool all_present = true;
  for (size_t i = 0; i < idx.shards.size(); ++i) {
    contents[i].name = idx.shards[i];
    contents[i].present = fs.stat(text::file_in(dir, idx.shards[i])).kind != file_kind::missing;
    all_present = all_present && contents[i].present;
  }
  if (!all_present) {
    const hf::cross_check_result missing = hf::cross_check(idx, contents);
    refuse_findings(errors_of(missing, true), shown_index);
  }

  // Each shard as a checkpoint of its own: every single-file check applies to it, and its
  // errors name it and the byte. safetensors shards are read ahead on several threads;
  // what they read (or the error they met) is taken below in shard order, as if each had
  // been opened there, so the first problem reported is the same.
  auto open_shard = [&](size_t i) {
    const std::string relative = text::file_in(dir, idx.shards[i]);
    std::unique_ptr<byte_source> src;
    try {
      src = fs.open(relative);
    } catch (error& e) {
      e.with_file(fs.display(relative));
      throw;
    }
    try {
      return open_checkpoint(std::move(src), options);
    } catch (error& e) {
      // Content no reader claims (a Git LFS pointer, an HTML error page, junk) where the
      // index promises a shard: the set is broken, not of a kind ckptool does not read.
      // A bare pickle too: torch.load, as the loaders call it, wants a zip or a legacy stream.
      if (e.kind() != errc::unsupported) throw;
      std::string why = e.message();
      bool claimed = false;
      try {
        const sniffed k = sniff_format(*fs.open(relative));
        claimed = k != sniffed::bare_pickle && k != sniffed::maybe_pickle;
      } catch (const error& unclaimed) {
        why = unclaimed.message();
      }
      if (claimed) throw;
      throw error(errc::corrupt, "the index names it as a shard, but it is no checkpoint: " + why, 0)
          .with_file(fs.display(relative));
    }
  };
  std::vector<ahead_shard> ahead = read_ahead(fs, dir, idx.shards, options.max_tensors, open_shard);
  std::vector<checkpoint> shards;
  shards.reserve(idx.shards.size());
  uint64_t tensors = 0;
  for (size_t i = 0; i < idx.shards.size(); ++i) {
    const std::string relative = text::file_in(dir, idx.shards[i]);
    if (i < ahead.size() && ahead[i].failure) std::rethrow_exception(ahead[i].failure);
    shards.push_back(i < ahead.size() && ahead[i].shard ? std::move(*ahead[i].shard) : open_shard(i));
    const checkpoint& s = shards.back();
    check_shard(s, idx.shards[i], fs.display(relative));
    if (s.format != shards.front().format)
      throw error(errc::unsupported, "a set mixing shard formats (" + std::string(format_name(shards.front().format)) +
                                         " and " + format_name(s.format) + "): no writer writes one")
          .with_file(fs.display(relative));
    if (s.byteorder != shards.front().byteorder)
      throw error(errc::unsupported, "a set mixing byte orders (" + shards.front().byteorder + " and " + s.byteorder +
                                         "): no writer writes one")
          .with_file(fs.display(relative));
    tensors += s.tensors.size();
    if (tensors > options.max_tensors)
      throw error(errc::limit, "the shards hold more than " + std::to_string(options.max_tensors) +
                                   " tensors (raise with --max-tensors)")
          .with_file(shown_index);
    for (size_t k = 0; k < s.keys.size(); ++k) contents[i].keys.emplace_back(s.keys.key(k));
    for (const storage_record& st : s.storages) contents[i].bytes += st.nbytes;
  }

  // Files beside the index that look like its shards: only their presence matters (no
  // loader opens them), so they are listed, never read.
  for (const std::string& name : hf::orphan_candidates(idx, fs.list(dir)))
    if (fs.stat(text::file_in(dir, name)).kind == file_kind::regular) contents.push_back({name, true, {}, 0});

  const hf::cross_check_result check = hf::cross_check(idx, contents);
  if (check.errors()) refuse_findings(errors_of(check), shown_index);
  check_dcp_written(shards, contents, idx, fs, dir, shown_index);

  checkpoint c;
  c.path = shown_index;
  c.index_path = shown_index;
  c.layout = checkpoint_layout::hf_shard_set;
  c.format = shards.front().format;
  c.byteorder = shards.front().byteorder;
  c.storage_alignment = shards.front().storage_alignment;
  c.index_bytes_read = r.bytes_read;
  for (const std::string& note : idx.notes) c.warnings.push_back("index " + note);
  for (const hf::finding& f : check.findings) c.warnings.push_back(f.message);
  size_t storages = 0, text = 0;
  for (const checkpoint& s : shards) {
    storages += s.storages.size();
    for (size_t k = 0; k < s.keys.size(); ++k) text += s.keys.key(k).size();
  }
  c.files.reserve(shards.size());
  c.storages.reserve(storages);
  c.tensors.reserve(size_t(tensors));
  c.keys.reserve(size_t(tensors), text);
  std::set<std::string> globals, unsafe;
  for (size_t i = 0; i < shards.size(); ++i) append_shard(c, std::move(shards[i]), idx.shards[i], globals, unsafe);
  c.globals.assign(globals.begin(), globals.end());
  c.unsafe_globals.assign(unsafe.begin(), unsafe.end());
  // The loaders take each shard's top-level dict whole: the state dict is the root.
  c.state_dict = value_path{};
  c.keys.shrink_to_fit();
  return c;
}

}  // namespace ckpt::detail
