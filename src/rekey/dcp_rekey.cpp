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

#include "ckpt/error.h"
#include "ckpt/sys_io.h"
#include "rekey/dcp_byte_items.h"
#include "rekey/dcp_metadata_rewrite.h"

namespace ckpt {
namespace {

constexpr const char* kMetadataName = ".metadata";

bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

[[noreturn]] void io_fail(const std::string& what, const std::string& path, int err) {
  throw error(errc::io, what + ": " + std::strerror(err)).with_file(path);
}

void require_empty_directory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d)
    throw error(errc::usage, std::string("the staging directory cannot be opened: ") + std::strerror(errno))
        .with_file(dir);
  bool empty = true;
  while (const dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) empty = false;
  ::closedir(d);
  if (!empty) throw error(errc::usage, "the staging directory is not empty").with_file(dir);
}

class out_file {
 public:
  explicit out_file(std::string path) : path_(std::move(path)) {
    fd_ = sys::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) io_fail("cannot create", path_, errno);
  }
  ~out_file() {
    if (fd_ >= 0) sys::close(fd_);
  }
  out_file(const out_file&) = delete;
  out_file& operator=(const out_file&) = delete;
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  void finish() {
    if (sys::fsync(fd_) != 0) io_fail("fsync failed", path_, errno);
    int fd = fd_;
    fd_ = -1;
    if (sys::close(fd) != 0) io_fail("close failed", path_, errno);
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

}  // namespace

dcp_rekey_result write_rekeyed_dcp(const file_opener& in, const std::string& in_dir, const std::vector<key_op>& ops,
                                   const std::string& staging_dir, const dcp_rekey_options& options) {
  const std::string dir = checked_relative_path(in_dir);
  auto rel = [&](const std::string& name) { return dir.empty() ? name : dir + "/" + name; };

  // What the directory holds, refused before anything is read if it is not what DCP writes.
  std::map<std::string, uint64_t> files;  // name -> size, every regular file but .metadata
  bool has_metadata = false;
  for (const std::string& name : in.list(dir)) {
    const file_stat st = in.stat(rel(name));
    if (st.kind != file_kind::regular)
      throw error(errc::unsupported, std::string(st.kind == file_kind::directory ? "a directory" : "not a regular file") +
                                         " inside a DCP checkpoint; rekey copies only the files DCP writes")
          .with_file(in.display(rel(name)));
    if (name == kMetadataName) {
      has_metadata = true;
      continue;
    }
    // use_collectives=False (2.9+) writes a rank-local __{r}.metadata per rank: copied as
    // they are, their keys would contradict the renamed ones.
    if (ends_with(name, ".metadata"))
      throw error(errc::unsupported, "rank-local metadata (dcp.save with use_collectives=False) is not rekeyed; "
                                     "only a directory with one global .metadata is")
          .with_file(in.display(rel(name)));
    files.emplace(name, st.size);
  }
  if (!has_metadata)
    throw error(errc::corrupt, "no .metadata: not a DCP checkpoint, or one whose save did not complete")
        .with_file(in.display(dir));

  const std::string md_name = in.display(rel(kMetadataName));
  dcp::metadata_rewrite rw;
  try {
    auto src = in.open(rel(kMetadataName));
    if (src->size() > options.lim.max_pickle_bytes)
      throw_limit("the .metadata pickle is " + std::to_string(src->size()) +
                  " bytes, over the pickle size limit (raise with --max-pickle-bytes)");
    std::vector<uint8_t> bytes = src->read_vector(0, size_t(src->size()));
    rw = dcp::rewrite_metadata(bytes.data(), bytes.size(), ops, options.lim, options.dry_run);
  } catch (error& e) {
    e.with_file(md_name);
    throw;
  }
  dcp_rekey_result result = std::move(rw.result);

  // Every byte range the index names lies in a file of the directory: a copy of a directory
  // that cannot load is no rekey.
  std::set<std::string> data;
  for (const auto& s : rw.before.storage_data) {
    auto f = files.find(s.relative_path);
    if (f == files.end())
      throw error(errc::corrupt, "storage_data['" + s.fqn + "'] points into '" + s.relative_path +
                                     "', which is not in the directory", s.at)
          .with_file(md_name);
    if (s.offset + s.length > f->second)
      throw error(errc::corrupt, "storage_data['" + s.fqn + "'] reaches byte " + std::to_string(s.offset + s.length) +
                                     " of '" + s.relative_path + "', which has " + std::to_string(f->second), s.at)
          .with_file(md_name);
    data.insert(s.relative_path);
  }
  dcp::check_byte_items(in, rel, rw.before, result.plan, options.lim, result);
  for (const auto& [name, size] : files) (data.count(name) ? result.data_files : result.other_files).push_back(name);
  if (options.dry_run) return result;

  require_empty_directory(staging_dir);
  const std::string out_dir = staging_dir.empty() || staging_dir.back() == '/' ? staging_dir : staging_dir + "/";
  uint64_t total = rw.bytes.size(), done = 0;
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
  out_file md(out_dir + kMetadataName);
  write_all(md.fd(), rw.bytes.data(), rw.bytes.size(), md.path());
  md.finish();
  result.metadata_bytes = rw.bytes.size();
  if (options.progress) options.progress(total, total);
  int dfd = sys::open(staging_dir.empty() ? "." : staging_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (dfd < 0) io_fail("cannot open", staging_dir, errno);
  sys::mark_next_fsync_as_directory();
  const int rc = sys::fsync(dfd);
  const int err = errno;
  sys::close(dfd);
  if (rc != 0) io_fail("fsync failed", staging_dir, err);
  return result;
}

}  // namespace ckpt
