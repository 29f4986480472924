#include "load_guard.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "ckpt/error.h"

namespace cli {
namespace {

// Building a module on meta reads no weights (src/torch/torchscript.cpp), so its resident
// memory is the compiler's: tens of MiB for large models. Growth past this is a file
// making LibTorch build something huge (a constant string folded to gigabytes, or
// allowed code allocating), stopped before the machine swaps.
constexpr uint64_t kMaxGrowthBytes = 4ull << 30;

uint64_t resident_bytes() {
  int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[128];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  unsigned long long size = 0, resident = 0;
  if (std::sscanf(buf, "%llu %llu", &size, &resident) != 2) return 0;
  return resident * uint64_t(::sysconf(_SC_PAGESIZE));
}

std::string printable(std::string s) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return s;
}

[[noreturn]] void die(const std::string& line) {
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
  // The loading thread may be inside LibTorch for good: no destructors, no atexit.
  ::_exit(ckpt::exit_code(ckpt::errc::limit));
}

}  // namespace

void add_code_flags(CLI::App& cmd, code_options& o) {
  cmd.add_flag("--allow-code", o.allow_code,
               "Load a TorchScript file even though LibTorch would run code of the file while loading it "
               "(__setstate__, evaluated defaults); without it such files are refused (exit 3)");
  cmd.add_option("--load-timeout", o.load_timeout,
                 "Seconds LibTorch may spend loading a TorchScript file (its code included) before ckptool "
                 "gives up (exit 3)")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
}

load_guard::load_guard(const std::string& file, double seconds) : seconds_(seconds) {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", seconds);
  timeout_line_ = "ckptool: limit: " + printable(file) + ": loading the TorchScript model (model code included) ran longer than " +
                  secs + " s (--load-timeout); stopped\n";
  memory_line_ = "ckptool: limit: " + printable(file) + ": loading the TorchScript model (model code included) used more than " +
                 std::to_string(kMaxGrowthBytes >> 20) + " MiB; stopped\n";
  thread_ = std::thread([this] { watch(); });
}

load_guard::~load_guard() {
  disarm();
  if (thread_.joinable()) thread_.join();
}

void load_guard::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
  cv_.notify_all();
}

void load_guard::watch() {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds_));
  const uint64_t base = resident_bytes();
  std::unique_lock<std::mutex> lock(mutex_);
  while (armed_) {
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) die(timeout_line_);
    cv_.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(20)), [this] { return !armed_; });
    if (!armed_) break;
    uint64_t rss = resident_bytes();
    if (rss > base && rss - base > kMaxGrowthBytes) die(memory_line_);
  }
}

}  // namespace cli
