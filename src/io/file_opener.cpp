#include "ckpt/file_opener.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ckpt/error.h"
#include "base/text_escape.h"

namespace ckpt {

std::string relative_name_problem(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.find('\0') != std::string_view::npos) return "holds a NUL byte";
  if (name.front() == '/') return "is absolute";
  if (name.find('\\') != std::string_view::npos)
    return "holds a backslash (a separator on Windows, where it names another path)";
  if (name.size() >= 2 && name[1] == ':' && ((name[0] | 0x20) >= 'a' && (name[0] | 0x20) <= 'z'))
    return "starts with a drive letter (a path on another drive on Windows)";
  for (size_t start = 0; start <= name.size();) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    const std::string_view part = name.substr(start, end - start);
    if (part == "..") return "goes up a directory (\"..\")";
    if (part.empty() || part == ".") return "has an empty or '.' component (not a plain file path)";
    start = end + 1;
  }
  return "";
}

std::string checked_relative_path(std::string_view name) {
  if (name.empty()) return "";
  const std::string why = relative_name_problem(name);
  // The name is hostile: shown escaped and quoted, so it cannot forge a message.
  if (!why.empty())
    throw error(errc::unsafe, "the file name \"" + escape_controls(std::string(name)) + "\" " + why +
                                  "; names read from a file must stay inside its directory");
  return std::string(name);
}

namespace {

file_kind kind_of(mode_t m) {
  if (S_ISREG(m)) return file_kind::regular;
  if (S_ISDIR(m)) return file_kind::directory;
  return file_kind::other;
}

}  // namespace

disk_opener::disk_opener(std::string root) : root_(std::move(root)) {}

std::string disk_opener::display(const std::string& relative) const {
  if (relative.empty()) return root_.empty() ? "." : root_;
  if (root_.empty()) return relative;
  return root_.back() == '/' ? root_ + relative : root_ + "/" + relative;
}

std::unique_ptr<byte_source> disk_opener::open(const std::string& relative) const {
  // file_source opens with input_file.h's rules: non-blocking, regular files only.
  return std::make_unique<file_source>(display(checked_relative_path(relative)));
}

file_stat disk_opener::stat(const std::string& relative) const {
  const std::string path = display(checked_relative_path(relative));
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return {};
    throw error(errc::io, std::string("cannot stat: ") + std::strerror(errno)).with_file(path);
  }
  return {kind_of(st.st_mode), S_ISREG(st.st_mode) ? uint64_t(st.st_size) : 0};
}

std::vector<std::string> disk_opener::list(const std::string& relative) const {
  const std::string path = display(checked_relative_path(relative));
  DIR* d = ::opendir(path.c_str());
  if (!d) throw error(errc::io, std::string("cannot list: ") + std::strerror(errno)).with_file(path);
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  const int e = errno;
  ::closedir(d);
  if (e != 0) throw error(errc::io, std::string("cannot list: ") + std::strerror(e)).with_file(path);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ckpt
