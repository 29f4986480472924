#include "storage_loader.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include <torch/cuda.h>

#include "aten_types.h"
#include "ckpt/error.h"

namespace ckpt::detail {
namespace {

void byteswap_in_place(uint8_t* p, uint64_t nbytes, uint32_t width) {
  if (width <= 1) return;
  for (uint64_t i = 0; i + width <= nbytes; i += width) std::reverse(p + i, p + i + width);
}

// torch.load(mmap=True) semantics: a private mapping, so writing to a tensor copies the
// page instead of touching the file.
std::vector<at::Tensor> load_mmap(const checkpoint& c, const std::vector<bool>& needed) {
  auto* fs = dynamic_cast<const file_source*>(c.source.get());
  if (!fs) throw error(errc::usage, "--mmap needs a checkpoint file");
  void* base = ::mmap(nullptr, size_t(c.file_size), PROT_READ | PROT_WRITE, MAP_PRIVATE, fs->fd(), 0);
  if (base == MAP_FAILED) throw error(errc::io, std::string("mmap failed: ") + std::strerror(errno)).with_file(c.path);
  size_t length = size_t(c.file_size);
  auto mapping = std::shared_ptr<void>(base, [length](void* p) { ::munmap(p, length); });
  std::vector<at::Tensor> bytes(c.storages.size());
  for (size_t i = 0; i < c.storages.size(); ++i) {
    if (!needed[i]) continue;
    const auto& s = c.storages[i];
    if (!s.file_offset || s.nbytes == 0) {
      bytes[i] = at::empty({0}, at::kByte);
      continue;
    }
    auto* p = static_cast<uint8_t*>(base) + *s.file_offset;
    bytes[i] = at::from_blob(p, {int64_t(s.nbytes)}, [mapping](void*) {}, at::TensorOptions().dtype(at::kByte));
  }
  return bytes;
}

}  // namespace

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

std::vector<at::Tensor> load_storages(const checkpoint& c, const std::vector<bool>& needed, const load_options& o) {
  check_device(o.device);
  if (o.device.is_meta()) {
    std::vector<at::Tensor> out(c.storages.size());
    for (size_t i = 0; i < c.storages.size(); ++i)
      if (needed[i]) out[i] = at::empty({int64_t(c.storages[i].nbytes)}, at::TensorOptions().dtype(at::kByte).device(at::kMeta));
    return out;
  }
  bool big_endian = c.byteorder == "big";
  if (o.mmap && (!o.device.is_cpu() || big_endian))
    throw error(errc::usage, big_endian ? "--mmap cannot serve big-endian data" : "--mmap works only with --device cpu");
  std::vector<at::Tensor> out;
  if (o.mmap) {
    out = load_mmap(c, needed);
  } else if (o.device.is_cuda() && !big_endian) {
    out = cuda_loader()(c, needed, o);
  } else {
    out = load_storages_cpu(c, needed, o);
  }
  if (big_endian) {
    // The element width of each storage decides the swap; then move to the device.
    for (size_t i = 0; i < out.size(); ++i) {
      if (!out[i].defined()) continue;
      byteswap_in_place(out[i].data_ptr<uint8_t>(), c.storages[i].nbytes, element_size(c.storages[i].type));
      if (!o.device.is_cpu()) out[i] = out[i].to(o.device);
    }
  }
  return out;
}

at::Tensor view_of(const tensor_record& t, const std::vector<at::Tensor>& storages, const c10::Device& device) {
  c10::ScalarType st = scalar_type(t.type);
  if (!t.storage) return at::empty_strided(t.shape, t.stride, at::TensorOptions().dtype(st).device(at::kMeta));
  const at::Tensor& bytes = storages.at(*t.storage);
  at::Tensor view = at::empty({0}, bytes.options().dtype(st));
  return view.set_(bytes.storage(), t.storage_offset, t.shape, t.stride);
}

}  // namespace ckpt::detail
