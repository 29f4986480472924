#include "common.h"

#include <charconv>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "ckpt/file_opener.h"
#include "model/layout.h"
#include "validators.h"

namespace cli {

// Upper bounds of the limit flags: far above any real checkpoint, low enough that a limit
// still limits something (a negative or 2^64 value is refused, never read as "unlimited").
constexpr uint64_t kMaxBytesLimit = 1ull << 40;   // 1 TiB
constexpr uint64_t kMaxCountLimit = 1ull << 36;   // ~69 billion values
// Depth is a policy limit only: nothing recurses as deep as the input nests (the pickle
// machine and every walk keep their own stacks), so it shares the count bound.
constexpr uint64_t kMaxDepthLimit = kMaxCountLimit;

void add_reader_flags(CLI::App& cmd, ckpt::open_options& opts) {
  auto& lim = opts.pickle_limits;
  auto limit = [&](const char* flag, uint64_t& value, const char* help, uint64_t max) {
    cmd.add_option(flag, value, help)->capture_default_str()->check(limit_value(max))->group("Limits");
  };
  limit("--max-pickle-bytes", lim.max_pickle_bytes, "Largest pickle (data.pkl) to parse", kMaxBytesLimit);
  limit("--max-depth", lim.max_depth, "Deepest nesting of pickle values", kMaxDepthLimit);
  limit("--max-memo", lim.max_memo, "Most pickle memo entries", kMaxCountLimit);
  limit("--max-container", lim.max_container, "Most elements in one container", kMaxCountLimit);
  limit("--max-string", lim.max_string, "Longest string or bytes value", kMaxBytesLimit);
  limit("--max-stack", lim.max_stack, "Most values on the pickle stack at once", kMaxCountLimit);
  limit("--max-values", lim.max_values, "Most pickle values and container elements decoded (bounds memory)",
        kMaxCountLimit);
  limit("--max-long-bytes", lim.max_long_bytes, "Longest pickle integer, in bytes", kMaxBytesLimit);
  limit("--max-tensors", opts.max_tensors,
        "Most tensors in a checkpoint (torch zip, legacy, TorchScript data, safetensors)", kMaxCountLimit);
  cmd.add_flag("--verify-crc", opts.verify_crc, "Check the CRC-32 of every zip record that has one recorded (reads all data)");
}

bool is_file_set(const std::string& resolved) {
  struct stat st;
  return ::stat(resolved.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

ckpt::file_fingerprint add_checkpoint_inputs(ckpt::output_set& set, const std::string& resolved,
                                             const std::string& hint) {
  const std::vector<std::string> files = ckpt::checkpoint_input_files(resolved);
  const ckpt::file_fingerprint first = set.add_input(files.front(), hint);
  for (size_t i = 1; i < files.size(); ++i) set.add_input(files[i]);
  return first;
}

std::string human_bytes(uint64_t n) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (n < 1024) return std::to_string(n) + " B";
  char buf[48];
  if (n < (uint64_t(1) << 53)) {
    // n / 1024^u to one decimal in integers: the value is n * 10 / 2^(10u) exactly, rounded
    // half to even as printf's "%.1f" (and to_chars below) round the exact double, which
    // below 2^53 is n itself. Twice per row of a 20,000-key table, the double path was 7%
    // of inspect.
    int u = 1;
    while (u < 5 && n >= (uint64_t(1) << (10 * (u + 1)))) ++u;
    const unsigned shift = 10 * unsigned(u);
    const unsigned __int128 tenths = static_cast<unsigned __int128>(n) * 10;
    uint64_t q = uint64_t(tenths >> shift);
    const unsigned __int128 rest = tenths & ((static_cast<unsigned __int128>(1) << shift) - 1);
    const unsigned __int128 half = static_cast<unsigned __int128>(1) << (shift - 1);
    if (rest > half || (rest == half && (q & 1))) ++q;
    char* end = std::to_chars(buf, buf + 32, q / 10).ptr;
    *end++ = '.';
    *end++ = char('0' + q % 10);
    *end++ = ' ';
    std::string out(buf, end);
    out += units[u];
    return out;
  }
  double v = double(n);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  // to_chars with a precision rounds as printf's "%.1f" does, without printf's parsing
  // of a format for each of 20,000 rows.
  char* end = std::to_chars(buf, buf + 32, v, std::chars_format::fixed, 1).ptr;
  *end++ = ' ';
  std::string out(buf, end);
  out += units[u];
  return out;
}

std::string with_commas(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

bool flush_stdout() {
  std::cout.flush();
  bool ok = static_cast<bool>(std::cout);
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) ok = false;
  return ok;
}

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }
bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

}  // namespace cli
