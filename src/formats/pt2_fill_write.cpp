// Writes the archive plan_fill planned (formats.md §14.9): the input archive's records in
// their order under its root folder, each copied byte for byte unless the plan replaces it,
// through the zip writer torch.save's archives come from (stored, 64-byte aligned, which is
// what torch.export.save writes and torch.export.load and nativert read).
#include <cstring>
#include <map>
#include <set>

#include "base/text.h"
#include "ckpt/error.h"
#include "ckpt/pt2_fill.h"
#include "ckpt/zip_writer.h"
#include "convert/tensor_bytes.h"

namespace ckpt::pt2 {
namespace {

bool row_major(const fill_view& v) {
  int64_t expected = 1;
  for (size_t d = v.shape.size(); d-- > 0;) {
    if (v.shape[d] != 1 && v.stride[d] != expected) return false;
    expected *= v.shape[d];
  }
  return true;
}

uint64_t numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

class filler {
 public:
  filler(const checkpoint& ckpt, const checkpoint& archive, const fill_plan& plan, zip::writer& w)
      : ar_(*archive.files.at(0).zip), plan_(plan), w_(w), bytes_(ckpt, plan.sources, plan.request) {}

  void write(const fill_file& f) {
    const uint64_t item = element_size(f.type);
    // One view filling the whole file as one run: the checkpoint's bytes go straight in.
    if (f.views.size() == 1) {
      const fill_view& v = f.views[0];
      const convert_tensor& t = plan_.sources.tensors[v.source];
      if (v.offset == 0 && row_major(v) && t.nbytes == f.nbytes)
        if (auto range = bytes_.straight_range(t)) {
          w_.add_record_copy(f.record, range->fd, range->offset, range->nbytes, range->crc32);
          return;
        }
    }
    std::vector<uint8_t> out;
    if (!f.base.empty()) {
      out = ar_.read_record(*ar_.find(f.base));
      if (out.size() != f.nbytes) throw_corrupt("record " + f.base + " changed size while being read");
    } else {
      out.assign(size_t(f.nbytes), 0);
    }
    // Which elements a view has written, so views that share bytes (tied weights, slices)
    // must agree: a file holds one value per element.
    std::vector<uint8_t> written(size_t(f.nbytes / item), 0);
    for (const fill_view& v : f.views) {
      const detail::tensor_buffer src = bytes_.gather(plan_.sources.tensors[v.source]);
      scatter(f, v, src.bytes.get(), item, out, written);
    }
    w_.add_record(f.record, out.data(), out.size());
  }

 private:
  void scatter(const fill_file& f, const fill_view& v, const uint8_t* src, uint64_t item, std::vector<uint8_t>& out,
               std::vector<uint8_t>& written) {
    const size_t rank = v.shape.size();
    const uint64_t n = numel(v.shape);
    if (n == 0) return;
    std::vector<int64_t> index(rank, 0);
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t at = uint64_t(v.offset);
      for (size_t d = 0; d < rank; ++d) at += uint64_t(index[d]) * uint64_t(v.stride[d]);
      uint8_t* dst = out.data() + at * item;
      const uint8_t* from = src + i * item;
      if (written[at]) {
        if (std::memcmp(dst, from, item) != 0)
          throw error(errc::unsupported, "archive entry " + text::quote(v.fqn, 80) + " shares " + f.record +
                                             " with another entry the checkpoint gives different values (element " +
                                             std::to_string(at) + "): the archive ties them, the checkpoint does not");
      } else {
        std::memcpy(dst, from, item);
        written[at] = 1;
      }
      for (size_t d = rank; d-- > 0;) {
        if (++index[d] < v.shape[d]) break;
        index[d] = 0;
      }
    }
  }

  const zip::archive& ar_;
  const fill_plan& plan_;
  zip::writer& w_;
  detail::tensor_bytes bytes_;
};

}  // namespace

void write_filled(const checkpoint& ckpt, const checkpoint& archive, const fill_plan& plan, int fd) {
  const source_file& in = archive.files.at(0);
  const zip::archive& ar = *in.zip;
  const file_extent extent = in.source->in_file();
  if (!extent.file) throw error(errc::unsupported, "the archive is not a file on disk").with_file(archive.path);
  std::map<std::string, const std::vector<size_t>*> files_at;
  for (const auto& [record, files] : plan.files_at) files_at[record] = &files;
  std::map<std::string, const std::string*> new_text;
  for (const auto& [record, text] : plan.new_text) new_text[record] = &text;
  const std::set<std::string> dropped(plan.dropped.begin(), plan.dropped.end());

  zip::writer w(fd, ar.prefix());
  w.reserve(ar.entries().size() + plan.files.size());
  filler fill(ckpt, archive, plan, w);
  for (const zip::entry& e : ar.entries()) {
    const std::string record(e.record);
    const auto f = files_at.find(record);
    // A file of that name replaces the record (its bytes rebuilt); new files (a meta
    // export's) follow the record they replace, which is dropped unless still named.
    bool replaced = false;
    if (f != files_at.end())
      for (size_t i : *f->second) replaced |= plan.files[i].record == record;
    auto t = new_text.find(record);
    if (replaced || dropped.count(record)) {
      // written below, or not at all
    } else if (t != new_text.end()) {
      w.add_record(record, t->second->data(), t->second->size());
    } else if (e.method == 0) {
      // A zero CRC on a non-empty record means "not recorded" (formats.md §2.1): computed then.
      std::optional<uint32_t> crc;
      if (e.crc32 != 0 || e.uncompressed_size == 0) crc = e.crc32;
      w.add_record_copy(record, extent.file->fd(), extent.offset + e.data_offset, e.uncompressed_size, crc);
    } else {
      const std::vector<uint8_t> bytes = ar.read_record(e);
      w.add_record(record, bytes);
    }
    if (f != files_at.end())
      for (size_t i : *f->second) fill.write(plan.files[i]);
  }
  w.finish();
}

}  // namespace ckpt::pt2
