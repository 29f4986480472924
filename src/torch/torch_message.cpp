#include "torch/torch_message.h"

namespace ckpt::detail {

// LibTorch messages span many lines (TorchScript tracebacks, source excerpts, suggestions);
// the CLI prints one. The interpreter wraps an operator's failure as
// "The following operation failed ...\nTraceback ...\n<Class>Error: <message>", where the
// traceback lines are indented, so the line that matters is the first unindented
// "...Error: " one; otherwise it is the first line.
std::string condense_torch_message(std::string_view msg) {
  constexpr size_t kMaxChars = 400;
  std::string_view line;
  if (msg.compare(0, 30, "The following operation failed") == 0) {
    size_t pos = 0;
    while (pos < msg.size()) {
      size_t nl = msg.find('\n', pos);
      std::string_view l =
          msg.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
      size_t colon = l.find("Error: ");
      if (colon != std::string_view::npos && l.find(' ') > colon) {
        line = l.substr(colon + 7);
        break;  // the first such line is the error; what follows is its continuation
      }
      if (nl == std::string_view::npos) break;
      pos = nl + 1;
    }
  }
  if (line.empty()) {
    size_t start = msg.find_first_not_of(" \n\t");
    if (start == std::string_view::npos) return "(no message)";
    msg.remove_prefix(start);
    line = msg.substr(0, msg.find('\n'));
  }
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.remove_suffix(1);
  std::string out(line);
  if (out.size() > kMaxChars) out = out.substr(0, kMaxChars) + "...";
  return out;
}

}  // namespace ckpt::detail
