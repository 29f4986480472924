// The directory half of a DCP rekey: which files there are, that storage_data's byte ranges
// lie in them, and the copy into the staging directory. The keys are dcp_metadata_rewrite's,
// the look into BYTE_IO values dcp_byte_items'.
#include "ckpt/dcp_rekey.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include "ckpt/dcp.h"
#include "ckpt/error.h"
#include "ckpt/output_dir.h"
#include "ckpt/sys_io.h"
#include "rekey/dcp_byte_items.h"
#include "rekey/dcp_metadata_rewrite.h"
#include "base/fail.h"

namespace ckpt {
namespace {

constexpr const char* kMetadataName = ".metadata";

void require_empty_directory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d)
    throw error(errc::usage, std::string("the staging directory cannot be opened: ") + std::strerror(errno))
        .with_file(dir);
  bool empty = true;
  // The owner file (ckpt/output_dir.h) is the staging directory's own, not a set's file.
  while (const dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0 &&
        std::strcmp(e->d_name, output_dir::owner_file) != 0)
      empty = false;
  ::closedir(d);
  if (!empty) throw error(errc::usage, "the staging directory is not empty").with_file(dir);
}

class out_file {
 public:
  explicit out_file(std::string path) : path_(std::move(path)) {
    fd_ = sys::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) detail::fail_io("cannot create", path_, errno);
  }
  ~out_file() {
    if (fd_ >= 0) sys::close(fd_);
  }
  out_file(const out_file&) = delete;
  out_file& operator=(const out_file&) = delete;
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  void finish() {
    if (sys::fsync(fd_) != 0) detail::fail_io("fsync failed", path_, errno);
    int fd = fd_;
    fd_ = -1;
    if (sys::close(fd) != 0) detail::fail_io("close failed", path_, errno);
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// A file the opener gives is copied in the kernel when it is a file on disk, else through a
// buffer (an in-memory opener).
void copy_whole(const byte_source& src, out_file& out, const std::function<void(uint64_t)>& on_copied) {
  const file_extent ext = src.in_file();
  if (ext.file) {
    copy_range(ext.file->fd(), src.name(), ext.offset, src.size(), out.fd(), out.path(), on_copied);
    return;
  }
  std::vector<uint8_t> buf;
  for (uint64_t done = 0; done < src.size();) {
    const size_t n = size_t(std::min<uint64_t>(src.size() - done, 1 << 20));
    buf.resize(n);
    src.read_exact(done, buf.data(), n);
    write_all(out.fd(), buf.data(), n, out.path());
    done += n;
    if (on_copied) on_copied(done);
  }
}

// A rank-local save's files rewritten one by one, as one result: the plan is over every
// rank's keys together, so that two keys of different ranks taking one name are refused
// as two keys of one file are; coverage is checked over all ranks' boxes.
dcp_rekey_result merged_result(const std::vector<dcp::metadata_rewrite>& rws, const std::vector<key_op>& ops,
                               const std::vector<std::string>& names) {
  std::vector<dcp::metadata> befores;
  for (const auto& rw : rws) befores.push_back(rw.before);
  (void)dcp::merge_rank_local(std::move(befores), names);

  dcp_rekey_result r;
  std::vector<std::string> keys;
  std::set<std::string> seen;
  for (const auto& rw : rws)
    for (const auto& [from, to] : rw.result.plan.mapping)
      if (seen.insert(from).second) keys.push_back(from);
  r.plan = plan_rekey(std::move(keys), ops);
  if (!r.plan.collisions.empty()) {
    std::string lines;
    for (size_t i = 0; i < r.plan.collisions.size() && i < 5; ++i) {
      const auto& [to, from] = r.plan.collisions[i];
      lines += (i ? ", " : "") + std::string("'") + to + "' <- ";
      for (size_t j = 0; j < from.size() && j < 4; ++j) lines += (j ? ", '" : "'") + from[j] + "'";
    }
    throw error(errc::check_failed, std::to_string(r.plan.collisions.size()) +
                                        " new key(s) would be claimed by several keys of different ranks' metadata "
                                        "files; nothing written: " + lines);
  }
  std::set<std::string> bytes_seen, fields_seen;
  for (const auto& rw : rws) {
    r.storage_renamed += rw.result.storage_renamed;
    r.planner_renamed += rw.result.planner_renamed;
    for (const auto& b : rw.result.byte_items)
      if (bytes_seen.insert(b).second) r.byte_items.push_back(b);
    for (const auto& f : rw.result.unknown_fields)
      if (fields_seen.insert(f).second) r.unknown_fields.push_back(f);
  }
  return r;
}

}  // namespace

dcp_rekey_result write_rekeyed_dcp(const file_opener& in, const std::string& in_dir, const std::vector<key_op>& ops,
                                   const std::string& staging_dir, const dcp_rekey_options& options) {
  const std::string dir = checked_relative_path(in_dir);
  auto rel = [&](const std::string& name) { return dir.empty() ? name : dir + "/" + name; };

  // What the directory holds, refused before anything is read if it is not what DCP writes.
  std::map<std::string, uint64_t> files;  // name -> size, every regular file but the metadata
  bool has_global = false;
  std::vector<std::pair<uint32_t, std::string>> rank_local;
  for (const std::string& name : in.list(dir)) {
    const file_stat st = in.stat(rel(name));
    if (st.kind != file_kind::regular)
      throw error(errc::unsupported, std::string(st.kind == file_kind::directory ? "a directory" : "not a regular file") +
                                         " inside a DCP checkpoint; rekey copies only the files DCP writes")
          .with_file(in.display(rel(name)));
    if (name == kMetadataName) {
      has_global = true;
      continue;
    }
    if (std::optional<uint32_t> r = dcp::rank_local_metadata_rank(name)) {
      rank_local.emplace_back(*r, name);
      continue;
    }
    files.emplace(name, st.size);
  }
  // Beside .metadata (which dcp.load reads first), rank-local files are left over from
  // another save: copied as they are, their keys would contradict the renamed ones.
  if (has_global && !rank_local.empty())
    throw error(errc::unsupported, "rank-local metadata beside .metadata (left over from a save with "
                                   "use_collectives=False, which dcp.load does not read here): not rekeyed")
        .with_file(in.display(rel(rank_local.front().second)));
  if (!has_global && rank_local.empty())
    throw error(errc::corrupt, "no .metadata: not a DCP checkpoint, or one whose save did not complete")
        .with_file(in.display(dir));
  std::sort(rank_local.begin(), rank_local.end());
  std::vector<std::string> md_files;
  if (has_global) md_files.push_back(kMetadataName);
  for (const auto& [r, name] : rank_local) {
    if (r != md_files.size())
      throw error(errc::corrupt, "rank-local metadata files of ranks up to " + std::to_string(r) + " without __" +
                                     std::to_string(md_files.size()) + ".metadata: the save did not complete, or a "
                                     "file was lost")
          .with_file(in.display(dir));
    md_files.push_back(name);
  }

  std::vector<dcp::metadata_rewrite> rws;
  std::vector<std::string> md_names;
  for (const std::string& name : md_files) {
    md_names.push_back(in.display(rel(name)));
    try {
      auto src = in.open(rel(name));
      if (src->size() > options.lim.max_pickle_bytes)
        throw_limit("the " + name + " pickle is " + std::to_string(src->size()) +
                    " bytes, over the pickle size limit (raise with --max-pickle-bytes)");
      std::vector<uint8_t> bytes = src->read_vector(0, size_t(src->size()));
      rws.push_back(dcp::rewrite_metadata(bytes.data(), bytes.size(), ops, options.lim, options.dry_run, !has_global));
    } catch (error& e) {
      e.with_file(md_names.back());
      throw;
    }
  }
  dcp_rekey_result result = has_global ? std::move(rws[0].result) : merged_result(rws, ops, md_names);
  result.metadata_files = md_files;

  // Every byte range the index names lies in a file of the directory: a copy of a
  // directory that cannot load is no rekey.
  std::set<std::string> data;
  for (size_t m = 0; m < rws.size(); ++m) {
    for (const auto& s : rws[m].before.storage_data) {
      auto f = files.find(s.relative_path);
      if (f == files.end())
        throw error(errc::corrupt, "storage_data['" + s.fqn + "'] points into '" + s.relative_path +
                                       "', which is not in the directory", s.at)
            .with_file(md_names[m]);
      if (s.offset + s.length > f->second)
        throw error(errc::corrupt, "storage_data['" + s.fqn + "'] reaches byte " + std::to_string(s.offset + s.length) +
                                       " of '" + s.relative_path + "', which has " + std::to_string(f->second), s.at)
            .with_file(md_names[m]);
      data.insert(s.relative_path);
    }
  }
  for (const auto& rw : rws) dcp::check_byte_items(in, rel, rw.before, result.plan, options.lim, result);
  // Every rank of a rank-local save writes its own copy of a BYTE_IO value: listed once.
  for (auto* v : {&result.unchecked_byte_items, &result.byte_item_globals}) {
    std::set<std::string> seen;
    v->erase(std::remove_if(v->begin(), v->end(), [&](const std::string& x) { return !seen.insert(x).second; }), v->end());
  }
  for (const auto& [name, size] : files) (data.count(name) ? result.data_files : result.other_files).push_back(name);
  if (options.dry_run) return result;

  require_empty_directory(staging_dir);
  const std::string out_dir = staging_dir.empty() || staging_dir.back() == '/' ? staging_dir : staging_dir + "/";
  uint64_t total = 0, done = 0;
  for (const auto& rw : rws) total += rw.bytes.size();
  for (const auto& [name, size] : files) total += size;
  for (const auto& [name, size] : files) {
    auto src = in.open(rel(name));
    if (src->size() != size) throw error(errc::io, "changed while being read").with_file(src->name());
    out_file out(out_dir + name);
    const uint64_t base = done;
    copy_whole(*src, out, [&](uint64_t copied) {
      if (options.progress) options.progress(base + copied, total);
    });
    out.finish();
    done += size;
    result.bytes_copied += size;
  }
  // Last, as DCP writes it: its presence is what says the directory is complete.
  for (size_t m = 0; m < rws.size(); ++m) {
    out_file md(out_dir + md_files[m]);
    write_all(md.fd(), rws[m].bytes.data(), rws[m].bytes.size(), md.path());
    md.finish();
    result.metadata_bytes += rws[m].bytes.size();
  }
  if (options.progress) options.progress(total, total);
  int dfd = sys::open(staging_dir.empty() ? "." : staging_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (dfd < 0) detail::fail_io("cannot open", staging_dir, errno);
  sys::mark_next_fsync_as_directory();
  const int rc = sys::fsync(dfd);
  const int err = errno;
  sys::close(dfd);
  if (rc != 0) detail::fail_io("fsync failed", staging_dir, err);
  return result;
}

}  // namespace ckpt
