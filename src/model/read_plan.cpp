#include "model/read_plan.h"

#include <algorithm>
#include <stdexcept>

#include "ckpt/error.h"

namespace ckpt::detail {

read_plan plan_reads(const checkpoint& c, const std::vector<bool>& needed, const read_plan_options& o) {
  if (needed.size() != c.storages.size()) throw std::invalid_argument("plan_reads: one flag per storage expected");
  const uint64_t max_read = std::max<uint64_t>(o.max_read, 1);
  const uint64_t alignment = std::max<uint64_t>(o.share_alignment, 1);
  read_plan plan;
  std::vector<size_t> order;
  for (size_t i = 0; i < c.storages.size(); ++i) {
    if (!needed[i]) continue;
    plan.storages.push_back(i);
    const storage_record& s = c.storages[i];
    if (s.file >= c.files.size()) throw std::invalid_argument("plan_reads: a storage names a file the checkpoint lacks");
    // The range of an archive that holds the data is not the data (a DCP chunk opened from
    // metadata alone): reading it as a tensor would be a wrong result.
    if (s.archive_range)
      throw error(errc::unsupported, "storage " + s.key + " was read from metadata alone (its chunk archive was not "
                                     "opened): it has no data range to read")
          .with_file(c.files[s.file].path);
    if (s.file_offset && s.nbytes) order.push_back(i);
  }
  // File order: sequential reads are what the page cache, read-ahead and disks like best.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const storage_record &x = c.storages[a], &y = c.storages[b];
    if (x.file != y.file) return x.file < y.file;
    return *x.file_offset != *y.file_offset ? *x.file_offset < *y.file_offset : a < b;
  });

  bool last_shares = false;  // whether the last read may take more storages
  for (size_t i : order) {
    const storage_record& s = c.storages[i];
    const uint32_t file = s.file;
    const uint64_t offset = *s.file_offset, n = s.nbytes;
    plan.storage_bytes += n;
    const bool shares = n < o.share_below && n <= max_read && offset % alignment == 0;
    if (shares && last_shares) {
      read_op& last = plan.reads.back();
      const uint64_t end = last.offset + last.nbytes;
      // Overlapping storages (no format ckptool reads has them) are not merged: each read
      // keeps its pieces in ascending, disjoint order.
      if (last.file == file && offset >= end && offset - end <= o.max_gap &&
          offset + n - last.offset <= std::min(o.max_shared_read, max_read)) {
        plan.pieces.push_back({i, 0, offset - last.offset, n});
        ++last.piece_count;
        last.nbytes = offset + n - last.offset;
        continue;
      }
    }
    last_shares = shares;
    if (n <= max_read) {
      plan.reads.push_back({file, offset, n, plan.pieces.size(), 1});
      plan.pieces.push_back({i, 0, 0, n});
      continue;
    }
    // Longer than a read: cut at multiples of max_read in the file.
    for (uint64_t at = offset, end = offset + n; at < end;) {
      const uint64_t cut = std::min(end, (at / max_read + 1) * max_read);
      plan.reads.push_back({file, at, cut - at, plan.pieces.size(), 1});
      plan.pieces.push_back({i, at - offset, 0, cut - at});
      at = cut;
    }
  }
  return plan;
}

std::vector<const byte_source*> file_sources(const checkpoint& c) {
  std::vector<const byte_source*> out;
  out.reserve(c.files.size());
  for (const source_file& f : c.files) out.push_back(f.source.get());
  return out;
}

std::vector<bool> storages_of(const checkpoint& c, const std::vector<size_t>& tensors) {
  std::vector<bool> needed(c.storages.size(), false);
  // A tensor's own storage, a per-channel quantizer's scales and zero points, and a sparse
  // or nested tensor's components (which are tensor records themselves).
  std::vector<const tensor_record*> todo;
  for (size_t k : tensors) todo.push_back(&c.tensors.at(k));
  while (!todo.empty()) {
    const tensor_record& t = *todo.back();
    todo.pop_back();
    if (t.storage) needed.at(*t.storage) = true;
    if (t.quant && t.quant->scales) todo.push_back(&*t.quant->scales);
    if (t.quant && t.quant->zero_points) todo.push_back(&*t.quant->zero_points);
    if (t.composite())
      for (const auto& part : t.kind->components) todo.push_back(&*part.second);
  }
  return needed;
}

}  // namespace ckpt::detail
