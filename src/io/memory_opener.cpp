#include <algorithm>

#include "ckpt/error.h"
#include "ckpt/file_opener.h"

namespace ckpt {

memory_opener::memory_opener(std::string root_name) : root_name_(std::move(root_name)) {}

void memory_opener::add(const std::string& relative, std::vector<uint8_t> bytes) {
  files_[checked_relative_path(relative)] = std::move(bytes);
}

void memory_opener::add(const std::string& relative, std::string_view text) {
  add(relative, std::vector<uint8_t>(text.begin(), text.end()));
}

std::string memory_opener::display(const std::string& relative) const {
  return relative.empty() ? root_name_ : root_name_ + "/" + relative;
}

file_stat memory_opener::stat(const std::string& relative) const {
  const std::string p = checked_relative_path(relative);
  if (p.empty()) return {file_kind::directory, 0};
  auto it = files_.find(p);
  if (it != files_.end()) return {file_kind::regular, it->second.size()};
  // A directory is any prefix of a file's path; files_ is sorted, so the first name
  // after "p/" tells.
  it = files_.lower_bound(p + "/");
  if (it != files_.end() && it->first.compare(0, p.size() + 1, p + "/") == 0) return {file_kind::directory, 0};
  return {};
}

std::unique_ptr<byte_source> memory_opener::open(const std::string& relative) const {
  const std::string p = checked_relative_path(relative);
  auto it = files_.find(p);
  if (it != files_.end()) return std::make_unique<memory_source>(it->second, display(p));
  // The words file_source's open would use, so tests see the messages users see.
  if (stat(p).kind == file_kind::directory)
    throw error(errc::usage, "not a regular file: a directory").with_file(display(p));
  throw error(errc::io, "cannot open: No such file or directory").with_file(display(p));
}

std::vector<std::string> memory_opener::list(const std::string& relative) const {
  const std::string p = checked_relative_path(relative);
  if (stat(p).kind != file_kind::directory)
    throw error(errc::io, "cannot list: Not a directory").with_file(display(p));
  const std::string prefix = p.empty() ? "" : p + "/";
  std::vector<std::string> names;
  for (auto it = files_.lower_bound(prefix); it != files_.end() && it->first.compare(0, prefix.size(), prefix) == 0;
       ++it) {
    std::string rest = it->first.substr(prefix.size());
    std::string child = rest.substr(0, rest.find('/'));
    if (names.empty() || names.back() != child) names.push_back(std::move(child));
  }
  // "a.x" sorts before "a/b" as a path but after "a" as a name.
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

}  // namespace ckpt
