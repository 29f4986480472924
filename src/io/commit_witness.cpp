#include "ckpt/commit_witness.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "base/text.h"
#include "ckpt/output_dir.h"
#include "io/temp_registry.h"

namespace ckpt {

commit_witness::commit_witness(std::string staging, std::string target, bool new_directory)
    : staging_(std::move(staging)), target_(std::move(target)), new_directory_(new_directory) {
  struct stat st;
  if (::lstat(staging_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  // A descriptor of our own: the lock test below is on this open file, never on the
  // committer's, and the file stays reachable after commit() unlinks its name.
  owner_fd_ = ::open((staging_ + "/" + output_dir::owner_file).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
}

commit_witness::~commit_witness() {
  if (owner_fd_ >= 0) ::close(owner_fd_);
}

std::optional<bool> commit_witness::committed() noexcept {
  if (!new_directory_ || owner_fd_ < 0 || ino_ == 0) return std::nullopt;
  // Shared: several witnesses test at once without taking the lock from one another;
  // only the committer's exclusive lock conflicts.
  bool gone = false;
  for (int attempt = 0; attempt < 100 && !gone; ++attempt) {
    if (::flock(owner_fd_, LOCK_SH | LOCK_NB) == 0) {
      ::flock(owner_fd_, LOCK_UN);
      gone = true;
    } else if (errno != EWOULDBLOCK) {
      return std::nullopt;
    } else {
      ::usleep(50000);
    }
  }
  if (!gone) return std::nullopt;
  struct stat st;
  if (::lstat(target_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) {
    // Renamed: in place. The committer syncs the parent next; it may not have.
    const int dfd = ::open(text::parent_directory(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
    return true;
  }
  // Not renamed, and no one left to rename it: abandoned (another witness may be removing
  // it too; removing what is gone is no error).
  if (::lstat(staging_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_)
    temp_registry::remove_directory(staging_.c_str());
  return false;
}

}  // namespace ckpt
