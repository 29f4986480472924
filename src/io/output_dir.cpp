#include "ckpt/output_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <utility>

#include "ckpt/error.h"
#include "ckpt/sys_io.h"
#include "ckpt/byte_source.h"
#include "ckpt/dcp.h"
#include "formats/format_detect.h"
#include "formats/hf_index.h"
#include "io/temp_registry.h"
#include "model/layout.h"
#include "base/text.h"
#include "base/fail.h"

namespace ckpt {
namespace {

std::string listed_in_quotes(const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  for (const std::string& n : names) quoted.push_back(text::in_quotes(n));
  return text::join_names(quoted, 4);
}

std::string real_path(const std::string& path) {
  char* real = ::realpath(path.c_str(), nullptr);
  if (!real) detail::fail_io("cannot resolve", path, errno);
  std::string out(real);
  std::free(real);
  return out;
}

struct identity {
  dev_t dev;
  ino_t ino;
  bool operator==(const identity& o) const { return dev == o.dev && ino == o.ino; }
};

// Every directory from the root down to `real` (a realpath), by identity: the physical
// chain, so a symlink or a bind mount of the same directory compares equal.
std::vector<identity> chain_of(const std::string& real) {
  std::vector<identity> out;
  std::string prefix = real;
  for (;;) {
    struct stat st;
    if (::stat(prefix.c_str(), &st) == 0) out.push_back({st.st_dev, st.st_ino});
    if (prefix == "/" || prefix.empty()) break;
    prefix = text::parent_directory(prefix);
  }
  return out;
}

bool contains(const std::vector<identity>& chain, const identity& id) {
  return std::find(chain.begin(), chain.end(), id) != chain.end();
}

std::vector<std::string> list_directory(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) detail::fail_io("cannot list the output directory", dir, errno);
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string random_suffix() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
  return suffix;
}

const char* layout_noun(set_layout l) {
  return l == set_layout::hf_index ? "Hugging Face shard set" : "torch.distributed.checkpoint";
}

void fsync_directory(const std::string& dir, const std::string& named) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) detail::fail_io("cannot open the output directory to sync it", named, errno);
  sys::mark_next_fsync_as_directory();
  int rc = sys::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) detail::fail_io("fsync of the output directory failed", named, err);
}

// A staging directory's name for OUTDIR `base`: "." + base + ".ckptool-" + 16 hex digits.
bool is_staging_name(const std::string& name, const std::string& base) {
  const std::string prefix = "." + base + ".ckptool-";
  if (name.size() != prefix.size() + 16 || name.compare(0, prefix.size(), prefix) != 0) return false;
  return std::all_of(name.begin() + std::ptrdiff_t(prefix.size()), name.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// True when directory `dfd` holds plain files only (what a staging directory holds).
bool only_plain_files(int dfd) {
  const int copy = ::dup(dfd);
  if (copy < 0) return false;
  DIR* d = ::fdopendir(copy);
  if (!d) {
    ::close(copy);
    return false;
  }
  bool plain = true;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    struct stat st;
    if (::fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) plain = false;
  }
  ::closedir(d);
  return plain;
}

bool is_regular_or_link(const std::string& path, identity* id = nullptr) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return false;
  if (id) *id = {st.st_dev, st.st_ino};
  return S_ISREG(st.st_mode) || S_ISLNK(st.st_mode);
}

// Whether `path` is a regular file (through a link) whose content is a checkpoint file
// ckptool or a loader writes into a set: a torch.save zip (a .bin shard, a .distcp file,
// meta.pt), a legacy torch.save stream, or safetensors. An index or .metadata is trusted
// to name such files only, never any file of OUTDIR: a planted index naming notes.txt
// must not make it a shard to remove.
bool holds_checkpoint_data(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;  // never opens a FIFO
  try {
    file_source src(path);
    const detail::sniffed kind = detail::sniff_format(src);
    return kind == detail::sniffed::zip || kind == detail::sniffed::safetensors ||
           kind == detail::sniffed::legacy_pickle;  // a .bin shard of a torch older than 1.6
  } catch (const error&) {
    return false;
  }
}

}  // namespace

output_dir::output_dir(std::string path, set_layout layout, bool force)
    : path_(std::move(path)), layout_(layout), force_(force) {}

output_dir::~output_dir() {
  discard();
  if (owner_fd_ >= 0) ::close(owner_fd_);
}

// Abandoned: the process that made it is gone, since the kernel drops a flock() with the
// process's last descriptor of the file, on any death. Its owner file appears only already
// locked (take_ownership), so a directory being set up is never taken for one.
bool output_dir::remove_if_abandoned(const std::string& staging) noexcept {
  struct stat st;
  if (::lstat(staging.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) return false;
  const int dfd = ::open(staging.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return false;
  bool removed = false;
  const int fd = ::openat(dfd, owner_file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  struct stat fst;
  if (fd >= 0 && ::fstat(fd, &fst) == 0 && S_ISREG(fst.st_mode) && ::flock(fd, LOCK_EX | LOCK_NB) == 0 &&
      only_plain_files(dfd)) {
    temp_registry::remove_directory(staging.c_str());
    removed = ::lstat(staging.c_str(), &st) != 0 && errno == ENOENT;
  }
  if (fd >= 0) ::close(fd);
  ::close(dfd);
  return removed;
}

// The staging directories of this OUTDIR that a killed run left: beside it (made while
// OUTDIR was absent) and inside it (made while it existed). Only names this class makes,
// for this OUTDIR's name, and only abandoned ones: another run's live directory is locked.
void output_dir::remove_abandoned(const std::string& home) {
  DIR* d = ::opendir(home.c_str());
  if (!d) return;  // nothing we could remove; the checks below report what matters
  std::vector<std::string> found;
  const std::string base = text::base_name(target_).substr(0, 200);
  while (dirent* e = ::readdir(d))
    if (is_staging_name(e->d_name, base)) found.push_back(text::file_in(home, e->d_name));
  ::closedir(d);
  std::sort(found.begin(), found.end());
  for (const std::string& f : found)
    if (remove_if_abandoned(f)) abandoned_.push_back(f);
}

// The owner file is locked before it gets its name, so it is never seen unlocked while
// this process lives. A file system without flock() leaves the directory unowned: then
// only this process's own cleanup (or a person) removes it, as before owner files.
void output_dir::take_ownership() {
  const std::string named = staging_ + "/" + owner_file;
  const std::string fresh = named + ".new";
  const int fd = ::open(fresh.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) detail::fail_io("cannot create the staging directory's owner file", fresh, errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    ::unlink(fresh.c_str());
    return;
  }
  // For a person who finds the directory: whose it was.
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::string who = "ckptool pid " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::write(fd, who.data(), who.size()) < 0 || ::rename(fresh.c_str(), named.c_str()) != 0) {
    const int e = errno;
    ::close(fd);
    detail::fail_io("cannot create the staging directory's owner file", fresh, e);
  }
  owner_fd_ = fd;
}

void output_dir::add_input(const std::string& path) {
  file_fingerprint fp;
  ::close(open_regular_input(path, &fp));
  inputs_.push_back({path, fp});
  input_dirs_.push_back(text::parent_directory(real_path(path)));
}

void output_dir::add_input_file(const std::string& path) {
  file_fingerprint fp;
  ::close(open_regular_input(path, &fp));
  inputs_.push_back({path, fp});
}

mode_t output_dir::add_input_dir(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) detail::fail_io("cannot use the input directory", path, errno);
  input_dirs_.push_back(real_path(path));
  if (!have_mode_) {
    mode_ = st.st_mode & 0777;
    have_mode_ = true;
  }
  return st.st_mode & 0777;
}

// OUTDIR is the input directory, lies inside one, or holds one: a previous set removed
// there, or a staging directory renamed over it, could take the input with it.
void output_dir::check_identity() {
  std::string given = path_;
  while (given.size() > 1 && given.back() == '/') given.pop_back();
  if (given.empty()) detail::fail_usage("the output directory name is empty", path_);
  struct stat lst, st;
  if (::lstat(given.c_str(), &lst) == 0) {
    if (::stat(given.c_str(), &st) != 0) detail::fail_usage("the output directory is a symlink that leads nowhere", path_);
    if (!S_ISDIR(st.st_mode))
      detail::fail_usage(std::string("the output directory is ") +
                (S_ISREG(st.st_mode) ? "a regular file" : S_ISBLK(st.st_mode) || S_ISCHR(st.st_mode) ? "a device" : "not a directory") +
                "; nothing written",
            path_);
    exists_ = true;
    target_ = real_path(given);
    parent_ = text::parent_directory(target_);
  } else {
    if (errno != ENOENT) detail::fail_io("cannot use the output directory", path_, errno);
    std::string name = text::base_name(given);
    if (name == "." || name == "..") detail::fail_usage("the output directory names no directory", path_);
    const std::string parent = text::parent_directory(given);
    if (::stat(parent.c_str(), &st) != 0) detail::fail_io("cannot use the output directory's parent " + text::in_quotes(parent), path_, errno);
    if (!S_ISDIR(st.st_mode)) detail::fail_usage("the output directory's parent is not a directory", path_);
    parent_ = real_path(parent);
    target_ = text::file_in(parent_, name);
  }

  // Where OUTDIR is (itself when it exists, else its parent, where it would appear).
  const std::vector<identity> out_chain = chain_of(exists_ ? target_ : parent_);
  identity out_id{};
  if (exists_) out_id = out_chain.front();
  // An input file whose directory is `in` only once its symlinks are followed: the user
  // named no such directory, so the refusal names the file and where it leads.
  auto through_symlink = [&](const std::string& in) -> std::string {
    for (const auto& file : inputs_) {
      const std::string real = real_path(file.path);
      if (text::parent_directory(real) == in && real_path(text::parent_directory(file.path)) != in)
        return "the input file " + text::in_quotes(file.path) + " is a symlink to " + text::in_quotes(real) + ", so ";
    }
    return std::string();
  };
  for (const std::string& in : input_dirs_) {
    struct stat ist;
    if (::stat(in.c_str(), &ist) != 0) continue;
    const identity in_id{ist.st_dev, ist.st_ino};
    if (exists_ && in_id == out_id)
      detail::fail_usage(through_symlink(in) + "the output directory is the input directory " + text::in_quotes(in) +
                             "; nothing written",
                         path_);
    if (contains(out_chain, in_id))
      detail::fail_usage(through_symlink(in) + "the output directory lies inside the input directory " +
                             text::in_quotes(in) + "; nothing written",
                         path_);
    if (exists_ && contains(chain_of(in), out_id))
      detail::fail_usage("the output directory contains the input directory " + text::in_quotes(in) + "; nothing written", path_);
  }
}

// A Hugging Face set of one shard has no index: save_torch_state_dict writes it under this
// name alone (its default pattern model{suffix}.safetensors, with no suffix), and so does
// convert --to hf. Loaders read it before any index.
constexpr const char* kSingleShardName = "model.safetensors";

void output_dir::find_previous_set(const std::vector<std::string>& listing) {
  std::vector<std::string> indexes;
  bool dcp = false, single_shard = false;
  for (const auto& n : listing) {
    if (detail::is_shard_index_name(n) && is_regular_or_link(text::file_in(target_, n))) indexes.push_back(n);
    if (n == ".metadata" && is_regular_or_link(text::file_in(target_, n))) dcp = true;
    if (n == kSingleShardName && is_regular_or_link(text::file_in(target_, n))) single_shard = true;
  }
  // Another layout, or two sets: writing beside them would leave a directory no loader
  // reads as one checkpoint, and which files to replace would be a guess.
  if (layout_ == set_layout::hf_index && dcp)
    detail::fail_usage("the output directory holds a torch.distributed.checkpoint (.metadata); a shard set beside it would "
          "make a directory no loader reads as one checkpoint; nothing written",
          path_);
  if (layout_ == set_layout::dcp && (!indexes.empty() || single_shard))
    detail::fail_usage("the output directory holds a Hugging Face " +
                           (indexes.empty() ? "set of one shard " + text::in_quotes(kSingleShardName)
                                            : "shard index " + text::in_quotes(indexes.front())) +
                           "; a torch.distributed.checkpoint beside it would make a directory no loader reads as one "
                           "checkpoint; nothing written",
                       path_);
  if (indexes.size() > 1)
    detail::fail_usage("the output directory holds " + std::to_string(indexes.size()) + " shard indexes (" + listed_in_quotes(indexes) +
              "): which set to replace would be a guess; nothing written",
          path_);

  std::set<std::string> prev;
  if (layout_ == set_layout::hf_index && indexes.size() == 1) {
    previous_last_ = indexes.front();
    const std::string index_path = text::file_in(target_, previous_last_);
    hf::index idx;
    try {
      idx = hf::parse_index(read_text_input(index_path, hf::index_limits{}.max_bytes));
    } catch (const error& e) {
      detail::fail_usage("the output directory holds an index that cannot be read (" + e.message() +
                "), so which files are its set is unknown: remove it yourself; nothing written",
            index_path);
    }
    prev.insert(previous_last_);
    for (const std::string& shard : idx.shards) {
      // Only plain names directly in OUTDIR are ever removed: a name with a directory in
      // it could lead through a symlink to files outside.
      if (shard.find('/') != std::string::npos || shard.find('\\') != std::string::npos) continue;
      if (!is_regular_or_link(text::file_in(target_, shard))) continue;
      if (!holds_checkpoint_data(text::file_in(target_, shard)))
        detail::fail_usage("the output directory's index " + text::in_quotes(previous_last_) + " names " +
                               text::in_quotes(shard) +
                               ", which is not a safetensors or torch file: it is no previous set ckptool may "
                               "replace; remove it yourself; nothing written",
                           index_path);
      prev.insert(shard);
    }
  } else if (layout_ == set_layout::hf_index && single_shard && indexes.empty()) {
    // No index to move aside: the new set's files are renamed in, then it is removed
    // unless the new set took its name.
    prev.insert(kSingleShardName);
  } else if (layout_ == set_layout::dcp && dcp) {
    // The set is `.metadata` and the files its storage_data names (not every *.distcp
    // beside it: a file it does not name is not of the set), and a Lightning checkpoint's
    // meta.pt (formats.md §9.6), which rekey and convert copy beside it.
    previous_last_ = ".metadata";
    const std::string metadata_path = text::file_in(target_, previous_last_);
    dcp::metadata md;
    try {
      struct stat st;
      if (::stat(metadata_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        throw error(errc::unsupported, "not a regular file");
      md = dcp::decode_metadata(file_source(metadata_path));
    } catch (const error& e) {
      detail::fail_usage("the output directory holds a .metadata that cannot be read (" + e.message() +
                             "), so which files are its set is unknown: remove it yourself; nothing written",
                         metadata_path);
    }
    prev.insert(previous_last_);
    for (const dcp::storage_item& item : md.storage_data) {
      const std::string& n = item.relative_path;
      if (n.empty() || n.find('/') != std::string::npos || n == "." || n == ".." || prev.count(n) ||
          !is_regular_or_link(text::file_in(target_, n)))
        continue;
      if (!holds_checkpoint_data(text::file_in(target_, n)))
        detail::fail_usage("the output directory's .metadata names " + text::in_quotes(n) +
                               ", which is not a torch.save or safetensors file: it is no previous set ckptool may "
                               "replace; remove it yourself; nothing written",
                           metadata_path);
      prev.insert(n);
    }
    const std::string meta_pt = text::file_in(target_, "meta.pt");
    if (is_regular_or_link(meta_pt) && holds_checkpoint_data(meta_pt)) prev.insert("meta.pt");
  }
  previous_.assign(prev.begin(), prev.end());
  for (const auto& n : listing)
    if (!prev.count(n)) others_.push_back(n);
}

void output_dir::open(const std::vector<std::string>& names, const std::string& last) {
  if (!staging_.empty()) return;
  names_ = names;
  last_ = last;
  for (const auto& n : names_)
    if (n.empty() || n == "." || n == ".." || n.find('/') != std::string::npos)
      throw error(errc::unsupported, "the output set names a file " + text::in_quotes(n) +
                                         " that is not a plain name in one directory; nothing written")
          .with_file(path_);
  if (std::find(names_.begin(), names_.end(), last_) == names_.end())
    throw error(errc::usage, "internal error: the set's index is not among its files").with_file(path_);
  check_identity();
  remove_abandoned(parent_);
  if (exists_) remove_abandoned(target_);

  if (exists_) {
    const std::vector<std::string> listing = list_directory(target_);
    find_previous_set(listing);
    if (!others_.empty() && !force_)
      detail::fail_usage("the output directory holds files that are not a previous " + std::string(layout_noun(layout_)) + " (" +
                listed_in_quotes(others_) +
                "); pass --force to write the set beside them (only a previous set's files are ever removed); "
                "nothing written",
            path_);
    // Even with --force, a new file never takes the name of a file that is not of the
    // previous set: replacing it would be deleting it.
    for (const auto& n : names_)
      if (std::find(others_.begin(), others_.end(), n) != others_.end())
        detail::fail_usage("the new set's file " + text::in_quotes(n) + " would replace a file of the output directory that is not of a "
                  "previous set; nothing written",
              path_);
    // The commit renames over and removes the previous set's files: none may be an input
    // under another name (a hard link).
    for (const auto& n : previous_) {
      identity id{};
      if (!is_regular_or_link(text::file_in(target_, n), &id)) continue;
      struct stat followed;
      bool has_target = ::stat(text::file_in(target_, n).c_str(), &followed) == 0;
      for (const auto& in : inputs_)
        if ((id.dev == in.fp.dev && id.ino == in.fp.ino) ||
            (has_target && followed.st_dev == in.fp.dev && followed.st_ino == in.fp.ino))
          detail::fail_usage("the previous set's file " + text::in_quotes(n) + " is the input " + text::in_quotes(in.path) +
                    " (a hard link or a symlink); nothing written",
                path_);
    }
  }

  // The staging directory: beside a new OUTDIR (renamed to it), inside an existing one
  // (its files are renamed out of it): either way on OUTDIR's file system.
  const std::string home = exists_ ? target_ : parent_;
  const std::string base = text::base_name(target_).substr(0, 200);
  for (int attempt = 0; attempt < 100 && staging_.empty(); ++attempt) {
    std::string candidate = text::file_in(home, "." + base + ".ckptool-" + random_suffix());
    // Held before it exists, so that no moment has a directory a signal handler misses.
    registry_slot_ = temp_registry::hold_directory(candidate.c_str());
    if (::mkdir(candidate.c_str(), exists_ ? 0700 : mode_) == 0) {
      staging_ = candidate;
      break;
    }
    int e = errno;
    temp_registry::release(registry_slot_);
    registry_slot_ = -1;
    if (e != EEXIST) detail::fail_io("cannot create a staging directory", home, e);
  }
  if (staging_.empty()) detail::fail_io("cannot create a staging directory", home, EEXIST);
  take_ownership();
  // mkdir applied the umask; a new OUTDIR gets the input directory's bits as files get
  // their input's, less the umask.
}

void output_dir::commit() {
  if (committed_) return;
  if (staging_.empty()) throw error(errc::usage, "internal error: output directory committed before open()").with_file(path_);
  for (const auto& in : inputs_) {
    struct stat st;
    if (::stat(in.path.c_str(), &st) != 0)
      throw error(errc::io, "changed while being read (it is gone); nothing written").with_file(in.path);
    if (fingerprint_of(st) != in.fp) throw error(errc::io, "changed while being read; nothing written").with_file(in.path);
  }
  for (const auto& n : names_) {
    struct stat st;
    if (::lstat(staged(n).c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      throw error(errc::io, "internal error: the set's file " + text::in_quotes(n) + " was not written; nothing replaced")
          .with_file(path_);
  }
  // From here the staging directory may hold files the rollback needs: once its owner
  // file is gone, no later run takes it for abandoned, whatever happens to this process.
  if (owner_fd_ >= 0 && ::unlink((staging_ + "/" + owner_file).c_str()) != 0)
    detail::fail_io("cannot remove the staging directory's owner file", staging_, errno);
  fsync_directory(staging_, path_);
  temp_registry::release(registry_slot_);
  registry_slot_ = -1;
  temp_registry::mark_commit_started();
  if (exists_)
    commit_into_existing();
  else
    commit_new_directory();
}

void output_dir::commit_new_directory() {
  sys::kill_point("before-commit-rename");
  int rc = sys::rename(staging_.c_str(), target_.c_str(), RENAME_NOREPLACE);
  if (rc != 0 && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
    // rename(2) would replace an empty directory that appeared meanwhile: look first.
    struct stat st;
    if (::lstat(target_.c_str(), &st) == 0) errno = EEXIST, rc = -1;
    else rc = sys::rename(staging_.c_str(), target_.c_str());
  }
  if (rc != 0) {
    int e = errno;
    discard();
    detail::fail_io("cannot move the new set into place", path_, e);
  }
  staging_.clear();
  committed_ = true;
  sys::kill_point("after-commit-rename");
  fsync_directory(parent_, path_);
}

void output_dir::commit_into_existing() {
  // A step done, and how to undo it.
  struct step {
    std::string from, to;
    bool exchanged;
  };
  std::vector<step> done;
  const std::string hidden_index = previous_last_.empty() ? std::string() : staged(".previous-" + previous_last_);
  auto roll_back = [&] {
    for (auto it = done.rbegin(); it != done.rend(); ++it) {
      if (it->exchanged)
        ::renameat2(AT_FDCWD, it->from.c_str(), AT_FDCWD, it->to.c_str(), RENAME_EXCHANGE);
      else
        ::rename(it->to.c_str(), it->from.c_str());
    }
  };
  auto move = [&](const std::string& from, const std::string& to) {
    struct stat st;
    if (::lstat(to.c_str(), &st) == 0) {
      // The file replaced is kept at the staging name until the set is in place.
      if (sys::rename(from.c_str(), to.c_str(), RENAME_EXCHANGE) == 0) {
        done.push_back({from, to, true});
        return;
      }
      if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) detail::fail_io("rename failed", to, errno);
      // No RENAME_EXCHANGE: keep the old file under a second name first.
      const std::string keep = from + ".replaced";
      if (::link(to.c_str(), keep.c_str()) != 0) detail::fail_io("cannot keep the previous file aside", to, errno);
      if (sys::rename(from.c_str(), to.c_str()) != 0) {
        int e = errno;
        ::unlink(keep.c_str());
        detail::fail_io("rename failed", to, e);
      }
      // Undone in reverse: the new file back to staging, then the old one back.
      done.push_back({to, keep, false});
      done.push_back({from, to, false});
      return;
    }
    if (sys::rename(from.c_str(), to.c_str(), RENAME_NOREPLACE) != 0) detail::fail_io("rename failed", to, errno);
    done.push_back({from, to, false});
  };
  try {
    // 1. The previous index out of sight: from now until the new one is in, OUTDIR holds
    //    no set at all, never an index naming files of two sets.
    if (!previous_last_.empty()) {
      if (sys::rename(text::file_in(target_, previous_last_).c_str(), hidden_index.c_str(), RENAME_NOREPLACE) != 0)
        detail::fail_io("cannot move the previous index aside", text::file_in(target_, previous_last_), errno);
      done.push_back({text::file_in(target_, previous_last_), hidden_index, false});
    }
    // 2. The new files, each by one rename; 3. the index last.
    for (const auto& n : names_)
      if (n != last_) move(staged(n), text::file_in(target_, n));
    move(staged(last_), text::file_in(target_, last_));
  } catch (...) {
    roll_back();
    discard();
    throw;
  }
  committed_ = true;
  // 4. The set is in place: what is left of the previous one goes, and nothing else.
  std::set<std::string> kept(names_.begin(), names_.end());
  for (const auto& n : previous_)
    if (!kept.count(n) && n != previous_last_) ::unlink(text::file_in(target_, n).c_str());
  const std::string staging = staging_;
  staging_.clear();
  temp_registry::remove_directory(staging.c_str());
  fsync_directory(target_, path_);
}

void output_dir::discard() noexcept {
  if (registry_slot_ >= 0) temp_registry::release(registry_slot_);
  registry_slot_ = -1;
  if (!staging_.empty() && !committed_) temp_registry::remove_directory(staging_.c_str());
  staging_.clear();
}

}  // namespace ckpt
