#include "common.h"

#include <unistd.h>

#include <cstdio>

namespace cli {

void add_reader_flags(CLI::App& cmd, ckpt::open_options& opts) {
  auto& lim = opts.pickle_limits;
  cmd.add_option("--max-pickle-bytes", lim.max_pickle_bytes, "Largest pickle (data.pkl) to parse")
      ->capture_default_str()->group("Limits");
  cmd.add_option("--max-depth", lim.max_depth, "Deepest nesting of pickle values")
      ->capture_default_str()->group("Limits");
  cmd.add_option("--max-memo", lim.max_memo, "Most pickle memo entries")->capture_default_str()->group("Limits");
  cmd.add_option("--max-container", lim.max_container, "Most elements in one container")
      ->capture_default_str()->group("Limits");
  cmd.add_option("--max-string", lim.max_string, "Longest string or bytes value")
      ->capture_default_str()->group("Limits");
  cmd.add_option("--max-stack", lim.max_stack, "Most values on the pickle stack at once")
      ->capture_default_str()->group("Limits");
  cmd.add_option("--max-long-bytes", lim.max_long_bytes, "Longest pickle integer, in bytes")
      ->capture_default_str()->group("Limits");
  cmd.add_option("--max-tensors", opts.max_tensors, "Most tensors in a checkpoint (torch zip, legacy, TorchScript data, safetensors)")
      ->capture_default_str()->group("Limits");
  cmd.add_flag("--verify-crc", opts.verify_crc, "Check the CRC-32 of every zip record (reads all data)");
}

std::string human_bytes(uint64_t n) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (n < 1024) return std::to_string(n) + " B";
  double v = double(n);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string with_commas(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

namespace {
int g_exit_code = 0;
}
int last_exit_code() { return g_exit_code; }
void set_exit_code(int code) { g_exit_code = code; }

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }
bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

}  // namespace cli
