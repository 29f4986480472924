#include "torch/loader/storage_loader.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <torch/cuda.h>

#include "torch/aten_types.h"
#include "base/byte_order.h"
#include "ckpt/error.h"
#include "model/read_plan.h"

namespace ckpt::detail {
namespace {

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older headers lack the name
#endif

// Maps the page-cache pages of [begin, end) of the mapping into the page table (reading
// them from the disk first where they are not cached), read-only, so the copy-on-write
// mapping stays shared with the cache. MAP_POPULATE would not do: on a writable private
// mapping it write-faults every page, copying the whole checkpoint.
void populate_range(uint8_t* begin, uint8_t* end) {
  if (begin >= end) return;
  if (::madvise(begin, size_t(end - begin), MADV_POPULATE_READ) == 0) return;
  if (errno != EINVAL) throw error(errc::io, std::string("madvise(MADV_POPULATE_READ) failed: ") + std::strerror(errno));
  // Kernels before 5.14: touch one byte per page.
  const long page = ::sysconf(_SC_PAGESIZE);
  uint8_t sink = 0;
  for (volatile uint8_t* p = begin; p < end; p += page) sink ^= *p;
  (void)sink;
}

// Populates the pages of the plan's reads with a few threads, a read each: one thread's
// page-table work is far below what the page cache can feed.
// `wholes[f]` maps file f's underlying file from its byte 0; the checkpoint's file f starts
// `shifts[f]` bytes into it (a slice).
void populate(const std::vector<uint8_t*>& wholes, const std::vector<uint64_t>& shifts, const read_plan& plan,
              int threads, const std::function<void(uint64_t, uint64_t)>& progress) {
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  struct piece {
    uint8_t* begin;
    uint8_t* end;
  };
  std::vector<piece> pieces;  // page-aligned, in each file's mapping
  uint64_t total = 0;
  uint32_t last_file = 0;
  uint64_t last_end = 0;
  for (const read_op& op : plan.reads) {
    const uint64_t pos = shifts[op.file] + op.offset;  // in the underlying file
    uint64_t from = pos / page * page, to = (pos + op.nbytes + page - 1) / page * page;
    if (!pieces.empty() && op.file == last_file && from < last_end) from = last_end;  // a page two reads share
    if (from >= to) continue;
    pieces.push_back({wholes[op.file] + from, wholes[op.file] + to});
    last_file = op.file;
    last_end = to;
    total += to - from;
  }
  std::atomic<uint64_t> done{0};
  for_each_piece(pieces.size(), threads, [&](size_t i) {
    populate_range(pieces[i].begin, pieces[i].end);
    uint64_t now = done += uint64_t(pieces[i].end - pieces[i].begin);
    if (progress) progress(now, total);
  });
}

// torch.load(mmap=True) semantics: a private mapping, so writing to a tensor copies the
// page instead of touching the file. A checkpoint embedded in a larger file (a slice)
// maps the whole file and points into it: mmap offsets must be page-aligned, slices not.
std::vector<at::Tensor> load_mmap(const checkpoint& c, const std::vector<bool>& needed, const load_options& o) {
  // The reads of the plan are the ranges to populate: in file order, neighbours merged.
  read_plan_options po;
  po.max_read = 16ull << 20;
  const read_plan plan = plan_reads(c, needed, po);
  // Each file some selected storage lives in, mapped whole; a tensor keeps its file's
  // mapping alive.
  std::vector<uint8_t*> wholes(c.files.size(), nullptr), bases(c.files.size(), nullptr);
  std::vector<uint64_t> shifts(c.files.size(), 0);
  std::vector<std::shared_ptr<void>> mappings(c.files.size());
  for (const read_op& op : plan.reads) {
    if (mappings[op.file]) continue;
    const source_file& f = c.files[op.file];
    const file_extent where = f.source->in_file();
    if (!where.file) throw error(errc::usage, "--mmap needs a checkpoint file");
    const size_t length = size_t(where.file->size());
    void* whole = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, where.file->fd(), 0);
    if (whole == MAP_FAILED) throw error(errc::io, std::string("mmap failed: ") + std::strerror(errno)).with_file(f.path);
    mappings[op.file] = std::shared_ptr<void>(whole, [length](void* p) { ::munmap(p, length); });
    wholes[op.file] = static_cast<uint8_t*>(whole);
    shifts[op.file] = where.offset;
    bases[op.file] = wholes[op.file] + where.offset;
  }
  std::vector<at::Tensor> bytes(c.storages.size());
  for (size_t i : plan.storages) {
    const auto& s = c.storages[i];
    if (!s.file_offset || s.nbytes == 0) {
      bytes[i] = at::empty({0}, at::kByte);
      continue;
    }
    auto* p = bases[s.file] + *s.file_offset;
    bytes[i] = at::from_blob(p, {int64_t(s.nbytes)}, [mapping = mappings[s.file]](void*) {},
                             at::TensorOptions().dtype(at::kByte));
  }
  if (o.populate) populate(wholes, shifts, plan, loader_threads(o), o.progress);
  // Test hook (tests/py/test_torch_hostile.py, SIGBUS case): with this variable set, the
  // process stops itself once the file is mapped and populated, so a test can truncate
  // the file at exactly this point and continue it (SIGCONT); unset, nothing happens.
  if (std::getenv("CKPTOOL_TEST_STOP_AFTER_MAP")) ::raise(SIGSTOP);
  return bytes;
}

}  // namespace

int loader_threads(const load_options& o) {
  if (o.threads > 0) return o.threads;
  unsigned hw = std::thread::hardware_concurrency();
  return int(std::clamp(hw == 0 ? 4u : hw, 1u, 8u));
}

void for_each_piece(size_t count, int threads, const std::function<void(size_t)>& piece) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr failure;
  auto work = [&] {
    try {
      for (size_t i; !failed && (i = next++) < count;) piece(i);
    } catch (...) {
      if (!failed.exchange(true)) failure = std::current_exception();
    }
  };
  const int n = std::clamp<int>(threads, 1, int(std::max<size_t>(count, 1)));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {  // no more threads to be had: fewer share the work
      break;
    }
  }
  work();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

void check_device(const c10::Device& device) {
  if (device.is_cpu() || device.is_meta()) return;
  if (!device.is_cuda()) throw error(errc::device, "unsupported device " + device.str() + " (use cpu, cuda, cuda:N or meta)");
  // Loads LibTorch's CUDA half, without which no CUDA device is visible; throws when this
  // build has none.
  cuda_loader();
  if (!torch::cuda::is_available()) throw error(errc::device, "no CUDA device is available on this machine");
  if (device.has_index() && device.index() >= int(torch::cuda::device_count()))
    throw error(errc::device, "no such device " + device.str() + " (" + std::to_string(torch::cuda::device_count()) +
                                  " CUDA devices)");
}

std::vector<at::Tensor> load_storages(const checkpoint& c, const std::vector<bool>& needed, const load_options& o,
                                      const piece_targets* pieces) {
  check_device(o.device);
  if (pieces && pieces->empty()) pieces = nullptr;
  if (pieces) {
    if (pieces->base.size() != c.storages.size() || pieces->boxes.size() != c.storages.size())
      throw std::logic_error("load_storages: one piece target per storage expected");
    for (size_t i = 0; i < c.storages.size(); ++i)
      if (pieces->base[i] && needed[i]) throw std::logic_error("load_storages: a storage both a piece and needed");
  }
  if (o.device.is_meta()) {
    std::vector<at::Tensor> out(c.storages.size());
    for (size_t i = 0; i < c.storages.size(); ++i)
      if (needed[i]) out[i] = at::empty({int64_t(c.storages[i].nbytes)}, at::TensorOptions().dtype(at::kByte).device(at::kMeta));
    return out;
  }
  bool big_endian = c.byteorder == "big";
  if (o.mmap && (!o.device.is_cpu() || big_endian))
    throw error(errc::usage, big_endian ? "--mmap cannot serve big-endian data" : "--mmap works only with --device cpu");
  // No format ckptool reads has big-endian pieces; the swap below knows storages only.
  if (pieces && big_endian) throw error(errc::unsupported, "tensors assembled from pieces in a big-endian checkpoint");
  if (pieces && o.mmap) throw std::logic_error("load_storages: pieces are not mapped");
  std::vector<at::Tensor> out;
  if (o.mmap) {
    out = load_mmap(c, needed, o);
  } else if (o.device.is_cuda() && !big_endian) {
    out = cuda_loader()(c, needed, o, pieces);
  } else if (!pieces) {
    out = load_storages_cpu(c, needed, o);
  } else {
    // Storages first, then pieces; progress counts both against one total.
    uint64_t storage_bytes = 0, piece_bytes = 0;
    for (size_t i = 0; i < c.storages.size(); ++i) {
      const storage_record& s = c.storages[i];
      if (!s.file_offset) continue;
      if (needed[i]) storage_bytes += s.nbytes;
      if (pieces->base[i]) piece_bytes += s.nbytes;
    }
    load_options first = o;
    if (o.progress)
      first.progress = [&o, piece_bytes](uint64_t done, uint64_t total) { o.progress(done, total + piece_bytes); };
    out = load_storages_cpu(c, needed, first);
    land_pieces_cpu(c, *pieces, o, storage_bytes, storage_bytes + piece_bytes);
  }
  if (big_endian) {
    // The element width of each storage decides the swap; then move to the device.
    for (size_t i = 0; i < out.size(); ++i) {
      if (!out[i].defined()) continue;
      byteswap_in_place(out[i].data_ptr<uint8_t>(), c.storages[i].nbytes, byteswap_width(c.storages[i].type));
      if (!o.device.is_cpu()) out[i] = out[i].to(o.device);
    }
  }
  return out;
}

namespace {

// LibTorch's meta backend makes quantized dtypes contiguous only (no empty_strided, set_
// or as_strided): a dry run shows their shape and dtype, not their strides.
at::Tensor meta_tensor(const tensor_record& t, const at::TensorOptions& options) {
  if (c10::isQIntType(c10::typeMetaToScalarType(options.dtype()))) return at::empty(t.shape, options);
  return at::empty_strided(t.shape, t.stride, options);
}

// As torch.load's _rebuild_qtensor: an empty quantized tensor with the saved quantizer,
// then set_ onto the loaded bytes.
at::Tensor quantized_view(const tensor_record& t, const at::Tensor& bytes, const std::vector<at::Tensor>& storages,
                          const c10::Device& device) {
  const quantization& q = *t.quant;
  auto options = at::TensorOptions().dtype(scalar_type(t.type)).device(bytes.device());
  // A dry run: LibTorch has no quantizers on meta, and the plan needs none.
  if (bytes.is_meta()) return meta_tensor(t, options);
  try {
    at::Tensor out;
    if (!q.per_channel()) {
      out = at::_empty_affine_quantized(t.shape, options, q.scale, q.zero_point);
    } else {
      // Lists (older writers) become tensors of the types torch.load gives them.
      const bool float_qparams = q.scheme == "per_channel_affine_float_qparams";
      auto from_list = [&](const std::vector<double>& v, c10::ScalarType type) {
        return at::tensor(v, at::TensorOptions().dtype(at::kDouble)).to(bytes.device(), type);
      };
      at::Tensor scales = q.scales ? view_of(*q.scales, storages, device)
                                   : from_list(q.scale_list, float_qparams ? at::kFloat : at::kDouble);
      at::Tensor zero_points = q.zero_points ? view_of(*q.zero_points, storages, device)
                                             : from_list(q.zero_point_list, float_qparams ? at::kFloat : at::kLong);
      out = at::_empty_per_channel_affine_quantized(t.shape, scales, zero_points, q.axis, options);
    }
    return out.set_(bytes.storage(), t.storage_offset, t.shape, t.stride);
  } catch (const c10::Error& e) {
    throw error(errc::unsupported, "quantized tensor " + path_to_string(t.path) + " (" + q.scheme + " on " +
                                       bytes.device().str() + "): " + e.what_without_backtrace());
  }
}

at::Layout sparse_layout(const std::string& layout) {
  if (layout == "sparse_coo") return at::kSparse;
  if (layout == "sparse_csr") return at::kSparseCsr;
  if (layout == "sparse_csc") return at::kSparseCsc;
  if (layout == "sparse_bsr") return at::kSparseBsr;
  return at::kSparseBsc;
}

// As torch.load's _rebuild_sparse_tensor: the same LibTorch tensor from the same parts, with
// the coalesced flag as saved. torch.load checks the invariants only when asked; a file
// from a stranger is always checked here (index bounds, ordering, the coalesced claim),
// since LibTorch's kernels trust them. A dry run on meta has no indices to check.
// LibTorch warns on stderr that compressed sparse layouts are "in beta state" when it makes
// one; ckptool's stderr carries one-line errors only.
class silent_warnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

at::Tensor sparse_tensor(const tensor_record& t, const std::vector<at::Tensor>& storages, const c10::Device& device) {
  const tensor_kind& k = *t.kind;
  static silent_warnings silent;
  c10::WarningUtils::WarningHandlerGuard quiet(&silent);
  std::vector<at::Tensor> parts;
  for (const auto& part : k.components) parts.push_back(view_of(*part.second, storages, device));
  const at::Layout layout = sparse_layout(k.layout);
  const bool meta = parts.back().is_meta();
  try {
    if (layout == at::kSparse) {
      if (!meta) at::_validate_sparse_coo_tensor_args(parts[0], parts[1], t.shape, k.coalesced, false);
      return at::_sparse_coo_tensor_unsafe(parts[0], parts[1], t.shape, parts[1].options().layout(at::kSparse),
                                           k.coalesced);
    }
    if (!meta) at::_validate_sparse_compressed_tensor_args(parts[0], parts[1], parts[2], t.shape, layout, false);
    return at::_sparse_compressed_tensor_unsafe(parts[0], parts[1], parts[2], t.shape,
                                                parts[2].options().layout(layout));
  } catch (const c10::Error& e) {
    throw error(meta ? errc::unsupported : errc::corrupt,
                k.description() + " tensor " + path_to_string(t.path) + ": " + e.what_without_backtrace());
  }
}

}  // namespace

at::Tensor composite_tensor(const tensor_record& t, const std::vector<at::Tensor>& storages, const c10::Device& device) {
  if (t.kind->sparse()) return sparse_tensor(t, storages, device);
  // LibTorch has no jagged nested tensor (a Python subclass); strided ones it has, but
  // ckptool neither checks their offsets against the buffer nor writes them back yet.
  throw error(errc::unsupported, t.kind->description() + " tensor " + path_to_string(t.path) +
                                     ": materialize does not build nested tensors (inspect describes it)");
}

at::Tensor view_of(const tensor_record& t, const std::vector<at::Tensor>& storages, const c10::Device& device) {
  c10::ScalarType st = scalar_type(t.type);
  if (t.composite()) return composite_tensor(t, storages, device);
  if (!t.storage) return meta_tensor(t, at::TensorOptions().dtype(st).device(at::kMeta));
  const at::Tensor& bytes = storages.at(*t.storage);
  if (t.quant) return quantized_view(t, bytes, storages, device);
  if (c10::isQIntType(st))
    throw error(errc::unsupported, "tensor " + path_to_string(t.path) + " has the quantized dtype " + name(t.type) +
                                       " but no quantizer (not saved by _rebuild_qtensor)");
  at::Tensor view = at::empty({0}, bytes.options().dtype(st));
  view.set_(bytes.storage(), t.storage_offset, t.shape, t.stride);
  // A view tied to an unconjugated one shares its storage, as in torch.
  set_tensor_bits(view, t);
  return view;
}

void set_tensor_bits(at::Tensor& t, const tensor_record& r) {
  if (r.conj) t._set_conj(true);
  if (r.neg) t._set_neg(true);
}

}  // namespace ckpt::detail
