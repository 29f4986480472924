#include "ckpt/verify.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "ckpt/error.h"
#include "ckpt/pt2.h"
#include "ckpt/torchscript_code.h"
#include "report/pt2_report.h"

namespace ckpt {

verify_report verify_file(const std::string& path, const open_options& options,
                          const std::function<void(uint64_t, uint64_t)>& progress) {
  verify_report r;
  checkpoint c;
  try {
    c = open_checkpoint(path, options);
  } catch (const error& e) {
    // A file verify cannot read at all (unsupported) was not checked: it is not a failed
    // check (exit 1) but the refusal every verb gives (exit 3).
    if (e.kind() == errc::io || e.kind() == errc::usage || e.kind() == errc::unsupported) throw;
    r.problems.push_back(std::string(errc_name(e.kind())) + ": " + e.one_line());
    return r;
  }
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
  uint64_t total = 0, done = 0;
  bool archives = false;
  for (const source_file& f : c.files)
    if (f.zip) {
      archives = true;
      for (const auto& e : f.zip->entries()) total += e.compressed_size;
    }
  for (uint32_t fi = 0; fi < c.files.size(); ++fi) {
    const source_file& f = c.files[fi];
    if (!f.zip) continue;
    std::string in_file = several ? " of " + f.path : std::string();
    // An archive embedded in a file of the set (a DCP chunk) is named by where it starts.
    if (f.within) in_file += " (the archive at byte " + std::to_string(f.offset_within) + ")";
    for (const auto& e : f.zip->entries()) {
      const uint64_t before = done;
      const zip::crc_result crc = f.zip->record_crc(e, [&](uint64_t n) {
        done = before + n;
        if (progress) progress(done, total);
      });
      done = before + e.compressed_size;
      if (crc.outcome == zip::crc_outcome::not_recorded) {
        ++r.records_without_crc;
        continue;
      }
      ++r.records_checked;
      r.bytes_checked += e.compressed_size;
      if (crc.outcome == zip::crc_outcome::mismatch) {
        char crcs[48];
        std::snprintf(crcs, sizeof crcs, "recorded %08x, data has %08x", e.crc32, crc.computed);
        r.problems.push_back("CRC-32 mismatch in " + std::string(e.name) + in_file + " at byte " +
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
    for (const auto& s : c.storages) used.insert(std::string(s.record->record));
    for (const auto& m : c.pt2->models)
      for (const auto& o : m.opaque) used.insert(o.file);
    size_t unused = 0;
    for (const auto& e : c.files[0].zip->entries())
      if ((e.record.compare(0, 13, "data/weights/") == 0 || e.record.compare(0, 15, "data/constants/") == 0) &&
          e.record.size() >= 5 && e.record.compare(e.record.size() - 5, 5, ".json") != 0 && !used.count(e.record))
        ++unused;
    if (unused) r.notes.push_back(std::to_string(unused) + " payload files are named by no config entry (or only by tensors without data)");
  }
  if (archives) {
    if (r.records_without_crc)
      r.notes.push_back(std::to_string(r.records_without_crc) +
                        " records have no CRC recorded (saved with CRC computation off); their data was not checked");
    if (c.layout == checkpoint_layout::dcp) {
      size_t keys = c.keys.size(), chunks = c.tensors.size();
      r.notes.push_back("torch.distributed.checkpoint: " + std::to_string(keys) + " tensors from " + std::to_string(chunks) +
                        " chunks, each chunk's archive checked against .metadata, chunks tiling every tensor exactly");
    }
  } else if (c.format == file_format::safetensors) {
    r.notes.push_back("safetensors has no checksums; header, dtypes and byte ranges are valid");
  } else {
    r.notes.push_back("legacy torch files have no checksums; structure and views are valid");
  }
  return r;
}

}  // namespace ckpt
