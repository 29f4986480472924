#include "ckpt/verify.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "ckpt/error.h"
#include "ckpt/distributed.h"
#include "ckpt/pt2.h"
#include "ckpt/torchscript_code.h"
#include "report/pt2_report.h"

namespace ckpt {
namespace {

struct record_share {
  int rank = 0;
  int world = 1;
};

// What the CRC pass found: the one part of a report a parallel verify divides among ranks.
struct crc_pass {
  size_t records_checked = 0;
  size_t records_without_crc = 0;
  uint64_t bytes_checked = 0;
  std::vector<std::string> problems;
};

// The notes that sum up the CRC pass, added once it is complete (all ranks' shares).
struct summary_facts {
  bool opened = false;
  bool archives = false;
  bool dcp = false;
  bool safetensors = false;
  size_t keys = 0, chunks = 0;
};

void add_summary(verify_report& r, const summary_facts& f) {
  if (!f.opened) return;
  if (f.archives) {
    if (r.records_without_crc)
      r.notes.push_back(std::to_string(r.records_without_crc) +
                        " records have no CRC recorded (saved with CRC computation off); their data was not checked");
    if (f.dcp)
      r.notes.push_back("torch.distributed.checkpoint: " + std::to_string(f.keys) + " tensors from " +
                        std::to_string(f.chunks) +
                        " chunks, each chunk's archive checked against .metadata, chunks tiling every tensor exactly");
  } else if (f.safetensors) {
    r.notes.push_back("safetensors has no checksums; header, dtypes and byte ranges are valid");
    // HuggingFaceStorageWriter pieces (formats.md §9.10).
    if (f.dcp)
      r.notes.push_back("torch.distributed.checkpoint safetensors pieces: " + std::to_string(f.keys) + " tensors from " +
                        std::to_string(f.chunks) + " boxes, tiling every tensor exactly");
  } else {
    r.notes.push_back("legacy torch files have no checksums; structure and views are valid");
  }
}

// A rank's share of the records: record k of every archive, in file order, goes to the
// rank whose 1/world of the total bytes holds the record's middle byte. Contiguous and
// balanced to within one record; every record checked by exactly one rank.
bool in_share(uint64_t start, uint64_t size, uint64_t total, const record_share& share) {
  if (share.world <= 1) return true;
  if (total == 0) return share.rank == 0;
  const unsigned __int128 middle = (unsigned __int128)start + size / 2;
  uint64_t owner = uint64_t(middle * unsigned(share.world) / total);
  if (owner >= uint64_t(share.world)) owner = uint64_t(share.world) - 1;
  return owner == uint64_t(share.rank);
}

// verify_file's work on one share: every check of the metadata (the same on every rank)
// into `r`, the CRC of the share's records into `crc`; the summary notes left to the caller.
void verify_share(const std::string& path, const open_options& options,
                  const std::function<void(uint64_t, uint64_t)>& progress, const record_share& share,
                  verify_report& r, crc_pass& crc, summary_facts& facts) {
  checkpoint c;
  try {
    c = open_checkpoint(path, options);
  } catch (const error& e) {
    // A file verify cannot read at all (unsupported) was not checked: it is not a failed
    // check (exit 1) but the refusal every verb gives (exit 3).
    if (e.kind() == errc::io || e.kind() == errc::usage || e.kind() == errc::unsupported) throw;
    r.problems.push_back(std::string(errc_name(e.kind())) + ": " + e.one_line());
    return;
  }
  facts.opened = true;
  // The files' format; the layout is its own field (the text says "dcp of N files").
  r.format = format_name(c.format);
  r.layout = layout_name(c.layout);
  // Files on disk: a DCP chunk's archive inside a .distcp file is not one more file.
  r.files = size_t(std::count_if(c.files.begin(), c.files.end(), [](const source_file& f) { return !f.within; }));
  // A set's tensors are its keys (a DCP tensor is several chunk records).
  r.tensors = c.layout == checkpoint_layout::single_file ? c.tensors.size() : c.keys.size();
  // What a loader tolerates (formats.md §10.3): told, not failed.
  r.notes = c.warnings;
  r.unsafe_globals = c.unsafe_globals;
  for (const auto& g : c.unsafe_globals)
    r.problems.push_back("unsafe global " + g + " (torch.load(weights_only=False) would import it and may run it)");
  // torch.jit.load runs these while loading, on any device; ckptool refuses to hand such a
  // file to LibTorch without --allow-code, so verify cannot call it OK either.
  for (const source_file& f : c.files) {
    if (f.format != file_format::torchscript || !f.zip) continue;
    try {
      for (const auto& code : find_load_time_code(*f.zip))
        r.problems.push_back("code runs on load: " + describe(code) +
                             (code.offset ? " at byte " + std::to_string(*code.offset) : std::string()));
    } catch (error& e) {
      if (e.kind() == errc::io) throw;
      e.with_file(f.path);
      r.problems.push_back(std::string(errc_name(e.kind())) + ": " + e.one_line());
    }
  }

  // Every record of every archive, against the CRC-32 its central directory records.
  const bool several = c.files.size() > 1;
  uint64_t all = 0;
  bool archives = false;
  for (const source_file& f : c.files)
    if (f.zip) {
      archives = true;
      for (const auto& e : f.zip->entries()) all += e.compressed_size;
    }
  // This rank's bytes, for its progress.
  uint64_t total = 0, done = 0;
  {
    uint64_t at = 0;
    for (const source_file& f : c.files)
      if (f.zip)
        for (const auto& e : f.zip->entries()) {
          if (in_share(at, e.compressed_size, all, share)) total += e.compressed_size;
          at += e.compressed_size;
        }
  }
  uint64_t at = 0;  // where the next record starts among all records' bytes
  for (uint32_t fi = 0; fi < c.files.size(); ++fi) {
    const source_file& f = c.files[fi];
    if (!f.zip) continue;
    std::string in_file = several ? " of " + f.path : std::string();
    // An archive embedded in a file of the set (a DCP chunk) is named by where it starts.
    if (f.within) in_file += " (the archive at byte " + std::to_string(f.offset_within) + ")";
    for (const auto& e : f.zip->entries()) {
      const bool mine = in_share(at, e.compressed_size, all, share);
      at += e.compressed_size;
      if (!mine) continue;
      const uint64_t before = done;
      const zip::crc_result result = f.zip->record_crc(e, [&](uint64_t n) {
        done = before + n;
        if (progress) progress(done, total);
      });
      done = before + e.compressed_size;
      if (result.outcome == zip::crc_outcome::not_recorded) {
        ++crc.records_without_crc;
        continue;
      }
      ++crc.records_checked;
      crc.bytes_checked += e.compressed_size;
      if (result.outcome == zip::crc_outcome::mismatch) {
        char crcs[48];
        std::snprintf(crcs, sizeof crcs, "recorded %08x, data has %08x", e.crc32, result.computed);
        crc.problems.push_back("CRC-32 mismatch in " + std::string(e.name) + in_file + " at byte " +
                             std::to_string(f.source->origin_offset() + e.data_offset) + ": " + crcs);
      }
    }
    // Records under data/ that no tensor refers to: harmless to torch.load, but odd.
    if (f.format == file_format::torch_zip && !f.within) {
      std::set<std::string, std::less<>> used;
      for (const auto& s : c.storages)
        if (s.file == fi) used.insert("data/" + s.key);
      size_t unused = 0;
      for (const auto& e : f.zip->entries())
        if (e.record.compare(0, 5, "data/") == 0 && !used.count(e.record)) ++unused;
      if (unused) r.notes.push_back(std::to_string(unused) + " data records" + in_file + " are not used by any tensor");
    }
  }
  if (c.pt2) {
    // The configs against the program, and what is left to others.
    pt2_check pc = check_pt2(c);
    r.problems.insert(r.problems.end(), pc.problems.begin(), pc.problems.end());
    r.notes.insert(r.notes.end(), pc.notes.begin(), pc.notes.end());
    std::set<std::string, std::less<>> used;
    for (const auto& s : c.storages)
      if (s.record) used.insert(std::string(s.record->record));
    for (const auto& m : c.pt2->models)
      for (const auto& o : m.opaque) used.insert(o.file);
    size_t unused = 0;
    for (const auto& e : c.files[0].zip->entries())
      if ((e.record.compare(0, 13, "data/weights/") == 0 || e.record.compare(0, 15, "data/constants/") == 0) &&
          e.record.size() >= 5 && e.record.compare(e.record.size() - 5, 5, ".json") != 0 && !used.count(e.record))
        ++unused;
    if (unused) r.notes.push_back(std::to_string(unused) + " payload files are named by no config entry (or only by tensors without data)");
  }
  facts.archives = archives;
  facts.dcp = c.layout == checkpoint_layout::dcp;
  facts.safetensors = c.format == file_format::safetensors;
  facts.keys = c.keys.size();
  facts.chunks = c.tensors.size();
}

void add_crc(verify_report& r, crc_pass& crc) {
  r.records_checked += crc.records_checked;
  r.records_without_crc += crc.records_without_crc;
  r.bytes_checked += crc.bytes_checked;
  for (auto& p : crc.problems) r.problems.push_back(std::move(p));
}

}  // namespace

verify_report verify_file(const std::string& path, const open_options& options,
                          const std::function<void(uint64_t, uint64_t)>& progress) {
  verify_report r;
  crc_pass crc;
  summary_facts facts;
  verify_share(path, options, progress, {0, 1}, r, crc, facts);
  add_crc(r, crc);
  add_summary(r, facts);
  return r;
}

verify_report verify_file(const std::string& path, const open_options& options, process_group& group,
                          const std::function<void(uint64_t, uint64_t)>& progress,
                          const std::function<void()>& after_check) {
  verify_report r;
  crc_pass crc;
  summary_facts facts;
  run_collectively(group, "verify/check", [&] {
    verify_share(path, options, progress, {group.rank(), group.world()}, r, crc, facts);
    if (after_check) after_check();
  });
  if (group.world() == 1) {
    add_crc(r, crc);
    add_summary(r, facts);
    return r;
  }
  // The metadata's checks are the same on every rank; the CRC pass is gathered, in rank
  // order, which is the records' order: the problems read as one process lists them.
  const nlohmann::json mine = {{"checked", crc.records_checked},
                               {"without_crc", crc.records_without_crc},
                               {"bytes", crc.bytes_checked},
                               {"problems", crc.problems}};
  const std::vector<std::string> all = group.all_gather("verify/crc", mine.dump());
  for (size_t k = 0; k < all.size(); ++k) {
    crc_pass part;
    try {
      const nlohmann::json j = nlohmann::json::parse(all[k]);
      part.records_checked = j.at("checked").get<size_t>();
      part.records_without_crc = j.at("without_crc").get<size_t>();
      part.bytes_checked = j.at("bytes").get<uint64_t>();
      part.problems = j.at("problems").get<std::vector<std::string>>();
    } catch (const std::exception&) {
      throw error(errc::io, "rank " + std::to_string(k) + " sent a verify report this ckptool cannot read");
    }
    add_crc(r, part);
  }
  add_summary(r, facts);
  return r;
}

}  // namespace ckpt
