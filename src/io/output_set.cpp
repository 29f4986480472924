#include "ckpt/output_set.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>

#include "ckpt/error.h"
#include "io/temp_registry.h"
#include "base/text.h"
#include "base/fail.h"

namespace ckpt {
namespace {

// Every name a temporary file of this process takes: `.NAME.ckptool-RANDOM`, next to its
// destination, so the rename never crosses a file system.
std::string temp_name(const std::string& directory, const std::string& target_base) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
  // Room for the prefix and suffix within NAME_MAX (255).
  return directory + "/." + target_base.substr(0, 200) + ".ckptool-" + suffix;
}

bool same_file(const struct stat& st, dev_t dev, ino_t ino) { return st.st_dev == dev && st.st_ino == ino; }

}  // namespace

void output_file::start_writeback(uint64_t bytes_out) {
#ifdef SYNC_FILE_RANGE_WRITE
  // Batches of 16 MiB keep the disk streaming without a system call per small record.
  constexpr uint64_t kBatch = 16 << 20;
  if (stream_ || !writeback_hint_works_ || fd_ < 0 || bytes_out < writeback_started_ + kBatch) return;
  if (::sync_file_range(fd_, off_t(writeback_started_), off_t(bytes_out - writeback_started_),
                        SYNC_FILE_RANGE_WRITE) != 0)
    writeback_hint_works_ = false;  // an unusual file system; fsync still runs
  writeback_started_ = bytes_out;
#else
  (void)bytes_out;
#endif
}

output_set::output_set() = default;

output_set::~output_set() { discard(); }

file_fingerprint output_set::add_input(const std::string& path, const std::string& hint) {
  file_fingerprint fp;
  ::close(open_regular_input(path, &fp));
  for (const auto& o : outputs_)
    if (o->exists_ && o->dev_ == fp.dev && o->ino_ == fp.ino)
      detail::fail_usage("output " + text::in_quotes(o->path_) +
                " is this input (the same file by another name, a hard link or a symlink); nothing written",
            path);
  inputs_.push_back({path, fp, hint});
  return fp;
}

output_file& output_set::add_output(const std::string& path, mode_t mode, const std::string& may_replace) {
  if (opened_) throw error(errc::usage, "output declared after the outputs were opened").with_file(path);
  auto out = std::make_unique<output_file>();
  output_file& o = *out;
  o.path_ = path;
  o.mode_ = mode;
  if (path.empty()) throw error(errc::usage, "the output file name is empty");
  if (path == "-") {
    if (::isatty(STDOUT_FILENO) == 1)
      detail::fail_usage("refusing to write binary data to a terminal (redirect standard output, or name a file)", path);
    o.stream_ = o.stdout_ = true;
    o.canonical_ = "-";
    struct stat st;
    if (::fstat(STDOUT_FILENO, &st) == 0) {
      o.exists_ = true;
      o.dev_ = st.st_dev;
      o.ino_ = st.st_ino;
    }
  } else {
    if (path.back() == '/') detail::fail_usage("output names a directory", path);
    // A symlink is kept and the file it leads to replaced: follow the chain by hand, since
    // its end may not exist yet (a dangling link names where to create the file).
    std::string target = path;
    struct stat st;
    bool exists = false;
    // What the name leads to, the way open() would follow it (/dev/stdout, /proc/self/fd/N
    // are links to a pipe that no chain walk could name): not a regular file, then it is
    // streamed into, or refused, under the name given.
    bool followed = ::stat(path.c_str(), &st) == 0;
    if (followed && !S_ISREG(st.st_mode)) exists = true;
    for (int hops = 0; !exists; ++hops) {
      if (hops > 40) detail::fail_io("cannot resolve the output", path, ELOOP);
      if (::lstat(target.c_str(), &st) != 0) {
        if (errno != ENOENT) detail::fail_io("cannot use the output", path, errno);
        break;
      }
      if (!S_ISLNK(st.st_mode)) {
        exists = true;
        break;
      }
      char link[PATH_MAX];
      ssize_t n = ::readlink(target.c_str(), link, sizeof link - 1);
      if (n < 0) detail::fail_io("cannot read the output's symlink", path, errno);
      link[n] = 0;
      target = link[0] == '/' ? std::string(link) : text::parent_directory(target) + "/" + link;
    }
    if (exists) {
      if (S_ISDIR(st.st_mode)) detail::fail_usage("output is a directory", path);
      if (S_ISBLK(st.st_mode)) detail::fail_usage("output is a block device; refusing to write to it", path);
      o.stream_ = !S_ISREG(st.st_mode);
      o.socket_ = S_ISSOCK(st.st_mode);
      o.exists_ = true;
      o.dev_ = st.st_dev;
      o.ino_ = st.st_ino;
    }
    o.target_ = target;
    o.directory_ = text::parent_directory(target);
    std::string base = text::base_name(target);
    char* real = ::realpath(o.directory_.c_str(), nullptr);
    if (!real) detail::fail_io("cannot use the output's directory " + text::in_quotes(o.directory_), path, errno);
    std::string dir(real);
    std::free(real);
    if (base == "." || base == "..") detail::fail_usage("output names a directory", path);
    o.canonical_ = (dir == "/" ? "" : dir) + "/" + base;
  }

  for (const auto& in : inputs_)
    if (o.exists_ && in.fp.dev == o.dev_ && in.fp.ino == o.ino_ && (may_replace.empty() || in.path != may_replace))
      detail::fail_usage("output " + text::in_quotes(path) + " is the input " + text::in_quotes(in.path) +
                " (the same file by another name, a hard link or a symlink); nothing written" +
                (in.hint.empty() ? "" : "; " + in.hint),
            path);
  for (const auto& other : outputs_)
    if (other->canonical_ == o.canonical_ || (o.exists_ && other->exists_ && other->dev_ == o.dev_ && other->ino_ == o.ino_))
      detail::fail_usage("outputs " + text::in_quotes(other->path_) + " and " + text::in_quotes(path) + " are the same file; nothing written", path);
  outputs_.push_back(std::move(out));
  return o;
}

void output_set::open() {
  if (opened_) return;
  opened_ = true;
  for (auto& op : outputs_) {
    output_file& o = *op;
    if (o.stdout_) {
      o.fd_ = STDOUT_FILENO;
    } else if (o.socket_) {
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      if (o.target_.size() >= sizeof addr.sun_path) detail::fail_io("cannot connect to the output socket", o.path_, ENAMETOOLONG);
      std::memcpy(addr.sun_path, o.target_.c_str(), o.target_.size() + 1);
      o.fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (o.fd_ < 0) detail::fail_io("cannot connect to the output socket", o.path_, errno);
      if (::connect(o.fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
        detail::fail_io("cannot connect to the output socket", o.path_, errno);
    } else if (o.stream_) {
      o.fd_ = sys::open(o.target_.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY, 0);
      if (o.fd_ < 0) detail::fail_io("cannot open the output", o.path_, errno);
    } else {
      for (int attempt = 0; attempt < 100 && o.fd_ < 0; ++attempt) {
        o.temp_ = temp_name(o.directory_, text::base_name(o.target_));
        // Held before it exists, so that no moment has a file a signal handler misses.
        o.registry_slot_ = temp_registry::hold(o.temp_.c_str());
        o.fd_ = sys::open(o.temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, o.mode_);
        if (o.fd_ < 0) {
          int e = errno;
          temp_registry::release(o.registry_slot_);
          o.registry_slot_ = -1;
          o.temp_.clear();
          if (e != EEXIST) detail::fail_io("cannot create a temporary file next to the output", o.path_, e);
        }
      }
      if (o.fd_ < 0) detail::fail_io("cannot create a temporary file next to the output", o.path_, EEXIST);
    }
  }
}

void output_set::check_inputs_unchanged() const {
  for (const auto& in : inputs_) {
    struct stat st;
    if (::stat(in.path.c_str(), &st) != 0)
      throw error(errc::io, "changed while being read (it is gone)").with_file(in.path);
    if (fingerprint_of(st) != in.fp) throw error(errc::io, "changed while being read; nothing written").with_file(in.path);
  }
}

void output_set::commit() {
  if (committed_) return;
  if (!opened_) open();
  check_inputs_unchanged();
  for (auto& op : outputs_) {
    output_file& o = *op;
    if (o.stream_) continue;
    // Without the fsync a crash after the rename can leave an empty file at the
    // destination (Ts'o; renameio).
    if (sys::fsync(o.fd_) != 0) detail::fail_io("fsync failed", o.path_, errno);
    int fd = o.fd_;
    o.fd_ = -1;
    if (sys::close(fd) != 0) detail::fail_io("close failed", o.path_, errno);
  }

  // From here the temporary names hold files the rollback needs: no signal handler may
  // remove them, and a program may let the command finish.
  for (auto& op : outputs_) {
    temp_registry::release(op->registry_slot_);
    op->registry_slot_ = -1;
  }
  if (!staged_) temp_registry::mark_commit_started();

  enum step { created, exchanged, backed_up, replaced };
  struct done_step {
    output_file* o;
    step s;
    std::string backup;
  };
  std::vector<done_step> done;
  auto roll_back = [&] {
    for (auto it = done.rbegin(); it != done.rend(); ++it) {
      output_file& o = *it->o;
      switch (it->s) {
        case exchanged:
          ::renameat2(AT_FDCWD, o.temp_.c_str(), AT_FDCWD, o.target_.c_str(), RENAME_EXCHANGE);
          break;
        case backed_up:
          ::rename(it->backup.c_str(), o.target_.c_str());
          break;
        case created:
          ::unlink(o.target_.c_str());
          break;
        case replaced:  // no way back on this file system; reported by the error below
          break;
      }
    }
  };
  try {
    for (auto& op : outputs_) {
      output_file& o = *op;
      if (o.stream_) continue;
      struct stat st;
      bool exists = ::lstat(o.target_.c_str(), &st) == 0;
      if (exists) {
        // The old file stays under the temporary name until every output is in place.
        if (sys::rename(o.temp_.c_str(), o.target_.c_str(), RENAME_EXCHANGE) == 0) {
          done.push_back({&o, exchanged, {}});
          continue;
        }
        if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) detail::fail_io("rename failed", o.path_, errno);
        // No RENAME_EXCHANGE here: keep the old file as a hard link instead.
        std::string backup = o.temp_ + "-old";
        bool linked = ::link(o.target_.c_str(), backup.c_str()) == 0;
        if (sys::rename(o.temp_.c_str(), o.target_.c_str()) != 0) {
          int e = errno;
          if (linked) ::unlink(backup.c_str());
          detail::fail_io("rename failed", o.path_, e);
        }
        done.push_back({&o, linked ? backed_up : replaced, linked ? backup : std::string()});
      } else {
        int rc = sys::rename(o.temp_.c_str(), o.target_.c_str(), RENAME_NOREPLACE);
        if (rc != 0 && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP))
          rc = sys::rename(o.temp_.c_str(), o.target_.c_str());
        if (rc != 0) detail::fail_io("rename failed", o.path_, errno);
        done.push_back({&o, created, {}});
      }
    }
  } catch (...) {
    roll_back();
    discard();
    throw;
  }
  committed_ = true;
  for (const auto& d : done) {
    if (d.s == exchanged) ::unlink(d.o->temp_.c_str());
    if (d.s == backed_up) ::unlink(d.backup.c_str());
    d.o->temp_.clear();
  }

  // The renames are only durable once the directories are. The new files are complete
  // either way, so a failure here is reported but the outputs stay.
  std::set<std::string> dirs;
  for (auto& op : outputs_)
    if (!op->stream_) dirs.insert(op->directory_);
  for (const auto& d : dirs) {
    const std::string& named = [&]() -> const std::string& {
      for (auto& op : outputs_)
        if (!op->stream_ && op->directory_ == d) return op->path_;
      return d;
    }();
    int dir = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) detail::fail_io("cannot open the output directory to sync it", named, errno);
    sys::mark_next_fsync_as_directory();
    int rc = sys::fsync(dir);
    int err = errno;
    ::close(dir);
    if (rc != 0) detail::fail_io("fsync of the output directory failed", named, err);
  }
}

bool output_set::writes_stdout() const {
  struct stat st;
  bool have = ::fstat(STDOUT_FILENO, &st) == 0;
  for (const auto& o : outputs_)
    if (o->stdout_ || (have && o->exists_ && same_file(st, o->dev_, o->ino_))) return true;
  return false;
}

void output_set::discard() noexcept {
  for (auto& op : outputs_) {
    output_file& o = *op;
    if (o.fd_ >= 0 && !o.stdout_) ::close(o.fd_);
    o.fd_ = -1;
    if (!committed_ && !o.temp_.empty()) ::unlink(o.temp_.c_str());
    o.temp_.clear();
    temp_registry::release(o.registry_slot_);
    o.registry_slot_ = -1;
  }
}

}  // namespace ckpt
