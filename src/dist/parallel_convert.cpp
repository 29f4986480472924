// convert --to hf and --to dcp over a process group (ckpt/parallel_convert.h). The files
// are the ones a single process writes (detail::write_hf_set_files, write_dcp_files), so
// the set is byte for byte the same; only who writes which file, and who commits, change.
#include "ckpt/parallel_convert.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <sstream>

#include "ckpt/commit_witness.h"
#include "ckpt/error.h"
#include "ckpt/sys_io.h"
#include "convert/convert_writers.h"
#include "convert/dcp_layout.h"

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

namespace {

// A rank other than 0 whose command failed after the staging directory was made: if rank 0
// is gone (a SIGKILL: no handler ran), its staging directory is abandoned, and this rank
// removes it. Rank 0 alive still holds its owner file locked: then nothing happens here.
// The kernel drops rank 0's lock as its process ends, which its lost connection may
// precede by a while (a large process's memory is torn down first, on a loaded machine
// later still): tries for up to 5 s.
void remove_if_abandoned(const std::string& staging) noexcept {
  for (int attempt = 0; attempt < 100 && !staging.empty(); ++attempt) {
    struct stat st;
    if (::lstat(staging.c_str(), &st) != 0 || output_dir::remove_if_abandoned(staging)) return;
    ::usleep(50000);
  }
}

// Only a lost rank is an I/O error among those every rank shares (a refusal, a corrupt
// input: rank 0 is alive and removes its staging directory itself).
template <typename F>
auto cleaning_up(process_group& group, const std::string& staging, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const error& e) {
    if (group.rank() != 0 && e.kind() == errc::io) remove_if_abandoned(staging);
    throw;
  }
}

// The staging directory every rank writes into, and on the ranks other than 0 a witness of
// rank 0's commit, for when rank 0 is lost before it says how that went.
struct staging_dir {
  std::string path, target;
  bool new_directory = false;
  std::unique_ptr<commit_witness> witness;
  commit_settler settler() const {
    if (!witness) return {};
    return [w = witness.get()] { return w->committed(); };
  }
};

// Paths may hold any byte but NUL; the staging path goes first with its length.
std::string encode_staging(const std::string& staging, bool new_directory, const std::string& target) {
  return std::to_string(staging.size()) + ":" + staging + (new_directory ? "N" : "E") + target;
}

staging_dir decode_staging(const std::string& said) {
  const size_t colon = said.find(':');
  const unsigned long long n = colon == std::string::npos ? 0 : std::strtoull(said.c_str(), nullptr, 10);
  if (colon == std::string::npos || n + 1 >= said.size() - colon)
    throw error(errc::io, "rank 0 sent a malformed staging directory message");
  staging_dir d;
  d.path = said.substr(colon + 1, size_t(n));
  const size_t kind = colon + 1 + size_t(n);
  d.new_directory = said[kind] == 'N';
  d.target = said.substr(kind + 1);
  return d;
}

// Rank 0 opens the output directory; every rank gets its staging directory's path.
staging_dir open_staging(process_group& group, output_dir* out, const std::vector<std::string>& files) {
  const int rank = group.rank();
  if (rank == 0 && !out) throw error(errc::usage, "internal error: rank 0 has no output directory");
  run_collectively(group, "convert/open", [&] {
    if (rank == 0) out->open(files, files.back());
  });
  // The staging directory is rank 0's: only it creates, commits or removes it. The others
  // write their files into it by name. One broadcast carries its path and what its commit
  // is ("N" + OUTDIR's real path when one rename to it, else "E" + it), so a rank that holds
  // the one holds the other.
  std::string said;
  if (rank == 0) said = encode_staging(out->staging_directory(), out->new_directory(), out->target());
  said = group.broadcast("convert/staging", said);
  staging_dir d = decode_staging(said);
  // Rank 0 writes nothing until every rank holds the path: a rank 0 killed once it writes
  // leaves a directory every survivor can remove, not one a survivor still waiting for the
  // broadcast never heard of (that one only the next run for OUTDIR would remove).
  cleaning_up(group, d.path, [&] { group.barrier("convert/staging/known"); });
  if (rank == 0) sys::kill_point("rank-0-staging-known");
  if (rank != 0 && !d.target.empty())
    d.witness = std::make_unique<commit_witness>(d.path, d.target, d.new_directory);
  return d;
}

void check_visible(const std::string& staging) {
  struct stat st;
  if (::stat(staging.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw error(errc::io, "rank 0's staging directory is not visible on this rank (" + std::string(std::strerror(errno)) +
                              "): the output directory must be on a file system every rank shares")
        .with_file(staging);
}

}  // namespace

convert_result write_converted_hf_set(process_group& group, const checkpoint& c, const convert_plan& plan,
                                      output_dir* out, const std::vector<std::string>& files,
                                      const convert_request& request, const std::function<void()>& before_commit) {
  const int rank = group.rank();
  const staging_dir opened = open_staging(group, out, files);
  const std::string& staging = opened.path;

  const std::vector<int> owner = assign_files(detail::hf_set_file_bytes(plan, request.max_shard_size), group.world());
  std::vector<bool> mine(owner.size());
  for (size_t f = 0; f < owner.size(); ++f) mine[f] = owner[f] == rank;
  return cleaning_up(group, staging, [&] {
    convert_result written;
    run_collectively(group, "convert/write", [&] {
      check_visible(staging);
      written = detail::write_hf_set_files(c, plan, staging, mine, request);
    });
    const std::vector<std::string> bytes = group.all_gather("convert/bytes", std::to_string(written.bytes_written));
    // Every file (the index too, rank 0's) is written and synced: the last checks, then the
    // commit only if every rank is still there to say they passed.
    commit_collectively(
        group, "convert/commit",
        [&] {
          if (before_commit) before_commit();
        },
        [&] { out->commit(); }, opened.settler());
    convert_result result;
    result.files = files;
    for (const auto& b : bytes) result.bytes_written += std::strtoull(b.c_str(), nullptr, 10);
    return result;
  });
}

namespace {

// write_converted_dcp once the staging directory is open.
convert_result write_dcp_share(process_group& group, const checkpoint& c, const convert_plan& plan,
                               const detail::dcp_layout& layout, output_dir* out, const std::vector<std::string>& files,
                               const convert_request& request, const std::function<void()>& before_commit,
                               const std::string& staging, const std::vector<bool>& mine,
                               const commit_settler& settler) {
  const int rank = group.rank();
  detail::dcp_written written;
  run_collectively(group, "convert/write", [&] {
    check_visible(staging);
    written = detail::write_dcp_files(c, plan, layout, staging, mine, request);
  });
  // Where each rank put its items, for rank 0's `.metadata`: "b K OFFSET LENGTH" per band
  // (the rank is the band's), "i K OFFSET LENGTH" per BYTE_IO item (rank 0's file).
  std::ostringstream mine_places;
  mine_places << written.result.bytes_written << "\n";
  for (size_t k = 0; k < layout.bands.size(); ++k)
    if (mine[layout.bands[k].rank])
      mine_places << "b " << k << " " << written.places[k].offset << " " << written.places[k].length << "\n";
  if (!mine.empty() && mine[0])
    for (size_t i = 0; i < written.byte_places.size(); ++i)
      mine_places << "i " << i << " " << written.byte_places[i].offset << " " << written.byte_places[i].length << "\n";
  const std::vector<std::string> gathered = group.all_gather("convert/places", mine_places.str());

  convert_result result;
  result.files = files;
  // Rank 0 writes `.metadata` (synced) into the staging directory as its part of the ready
  // step; the rename alone is left for the commit.
  auto ready = [&] {
    detail::dcp_written all;
    all.places.resize(layout.bands.size());
    all.byte_places.resize(plan.byte_items.size());
    for (const std::string& text : gathered) {
      std::istringstream in(text);
      uint64_t bytes = 0;
      in >> bytes;
      result.bytes_written += bytes;
      std::string tag;
      uint64_t k = 0, offset = 0, length = 0;
      while (in >> tag >> k >> offset >> length) {
        const bool band = tag == "b";
        if ((band && k >= all.places.size()) || (!band && (tag != "i" || k >= all.byte_places.size())))
          throw error(errc::io, "a rank reported an item this rank did not plan (internal error)");
        if (band)
          all.places[k] = {layout.bands[k].rank, offset, length};
        else
          all.byte_places[k] = {0, offset, length};
      }
    }
    if (rank == 0) result.bytes_written += detail::write_dcp_metadata(c, plan, layout, all, staging, out->path());
    if (before_commit) before_commit();
  };
  commit_collectively(group, "convert/commit", ready, [&] { out->commit(); }, settler);
  return result;
}

}  // namespace

convert_result write_converted_dcp(process_group& group, const checkpoint& c, const convert_plan& plan, output_dir* out,
                                   const std::vector<std::string>& files, const convert_request& request,
                                   const std::function<void()>& before_commit) {
  const int rank = group.rank();
  // Every rank lays the same plan out the same way; a refusal (a Range, a dimension the
  // tensor lacks) is every rank's at once.
  detail::dcp_layout layout;
  run_collectively(group, "convert/layout", [&] { layout = detail::lay_out(plan, request); });
  const staging_dir opened = open_staging(group, out, files);
  const std::string& staging = opened.path;
  // The rank files are divided; `.metadata`, last, is rank 0's.
  const std::vector<int> owner = assign_files(detail::dcp_file_bytes(layout, request.ranks), group.world());
  std::vector<bool> mine(request.ranks);
  for (size_t f = 0; f < mine.size(); ++f) mine[f] = owner[f] == rank;
  return cleaning_up(group, staging, [&] {
    return write_dcp_share(group, c, plan, layout, out, files, request, before_commit, staging, mine,
                           opened.settler());
  });
}


}  // namespace ckpt
