// convert --to hf over a process group (ckpt/parallel_convert.h). The files are the ones a
// single process writes (detail::write_hf_set_files), so the set is byte for byte the same;
// only who writes which file, and who commits, change.
#include "ckpt/parallel_convert.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "ckpt/error.h"
#include "convert/convert_writers.h"

namespace ckpt {

std::vector<int> assign_files(const std::vector<uint64_t>& bytes, int world) {
  std::vector<int> owner(bytes.size(), 0);
  if (world <= 1 || bytes.empty()) return owner;
  const size_t shards = bytes.size() - 1;  // the last goes to rank 0
  std::vector<size_t> order(shards);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  std::vector<uint64_t> load(size_t(world), 0);
  for (size_t f : order) {
    const size_t r = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    owner[f] = int(r);
    load[r] += bytes[f];
  }
  return owner;
}

convert_result write_converted_hf_set(process_group& group, const checkpoint& c, const convert_plan& plan,
                                      output_dir* out, const std::vector<std::string>& files,
                                      const convert_request& request, const std::function<void()>& before_commit) {
  const int rank = group.rank();
  if (rank == 0 && !out) throw error(errc::usage, "internal error: rank 0 has no output directory");
  run_collectively(group, "convert/open", [&] {
    if (rank == 0) out->open(files, files.back());
  });
  // The staging directory is rank 0's: only it creates, commits or removes it. The others
  // write their files into it by name.
  const std::string staging = group.broadcast("convert/staging", rank == 0 ? out->staging_directory() : std::string());

  const std::vector<int> owner = assign_files(detail::hf_set_file_bytes(plan, request.max_shard_size), group.world());
  std::vector<bool> mine(owner.size());
  for (size_t f = 0; f < owner.size(); ++f) mine[f] = owner[f] == rank;
  convert_result written;
  run_collectively(group, "convert/write", [&] {
    struct stat st;
    if (::stat(staging.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw error(errc::io, "rank 0's staging directory is not visible on this rank (" + std::string(std::strerror(errno)) +
                                "): the output directory must be on a file system every rank shares")
          .with_file(staging);
    written = detail::write_hf_set_files(c, plan, staging, mine, request);
    if (before_commit) before_commit();
  });
  const std::vector<std::string> bytes = group.all_gather("convert/bytes", std::to_string(written.bytes_written));

  run_collectively(group, "convert/commit", [&] {
    if (rank == 0) out->commit();
  });
  convert_result result;
  result.files = files;
  for (const auto& b : bytes) result.bytes_written += std::strtoull(b.c_str(), nullptr, 10);
  return result;
}

}  // namespace ckpt
