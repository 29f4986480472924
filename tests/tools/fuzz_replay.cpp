// Runs files through the fuzz targets' bodies (fuzz/targets.cpp) without libFuzzer, so
// every crash fixture and seed is replayed by the ordinary test suite (ctest fuzz_replay).
//
//   fuzz_replay [--target NAME] [--all-targets] [--max-ms N] [--verbose] PATH...
//
// A directory named after a target (tests/regressions/pickle/, fuzz/seeds/zip_index/, ...)
// runs its files, recursively, through that target; files in other directories (and
// files named directly) go through --target, or through every target without it. With
// --all-targets every file also goes through every other target. README*, *.md and dot
// files are skipped. Fails (exit 1) when one input takes longer than --max-ms (default
// 1000); a crash kills the process after naming the input on stderr.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "targets.h"

namespace fs = std::filesystem;
using ckpt::fuzz::target;

namespace {

char g_current[4096];

void on_fatal_signal(int sig) {
  const char msg[] = "\nfuzz_replay: crashed on input: ";
  (void)!::write(2, msg, sizeof msg - 1);
  (void)!::write(2, g_current, std::strlen(g_current));
  (void)!::write(2, "\n", 1);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

bool skipped(const fs::path& p) {
  std::string name = p.filename().string();
  return name.empty() || name[0] == '.' || name.rfind("README", 0) == 0 || p.extension() == ".md";
}

struct job {
  fs::path file;
  const target* t;
};

void add_file(std::vector<job>& jobs, const fs::path& file, const target* t, bool all) {
  if (skipped(file)) return;
  for (const target* x = ckpt::fuzz::targets_begin(); x != ckpt::fuzz::targets_end(); ++x)
    if (x == t || ((all || !t) && x != t)) jobs.push_back({file, x});
}

void add_path(std::vector<job>& jobs, const fs::path& p, const target* t, bool all) {
  if (fs::is_directory(p)) {
    std::vector<fs::path> children;
    for (const auto& e : fs::directory_iterator(p)) children.push_back(e.path());
    std::sort(children.begin(), children.end());
    for (const auto& c : children) {
      if (skipped(c)) continue;
      const target* named = fs::is_directory(c) ? ckpt::fuzz::find_target(c.filename().string()) : nullptr;
      add_path(jobs, c, named ? named : t, all);
    }
  } else if (fs::is_regular_file(p)) {
    add_file(jobs, p, t, all);
  } else {
    std::fprintf(stderr, "fuzz_replay: %s: no such file or directory\n", p.c_str());
    std::exit(2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const target* forced = nullptr;
  bool all = false, verbose = false;
  long max_ms = 1000;
  std::vector<fs::path> paths;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--target" && i + 1 < argc) {
      forced = ckpt::fuzz::find_target(argv[++i]);
      if (!forced) {
        std::fprintf(stderr, "fuzz_replay: unknown target %s\n", argv[i]);
        return 2;
      }
    } else if (a == "--all-targets") {
      all = true;
    } else if (a == "--max-ms" && i + 1 < argc) {
      max_ms = std::strtol(argv[++i], nullptr, 10);
    } else if (a == "--verbose" || a == "-v") {
      verbose = true;
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "usage: fuzz_replay [--target NAME] [--all-targets] [--max-ms N] [--verbose] PATH...\n");
      return 2;
    } else {
      paths.emplace_back(a);
    }
  }
  if (paths.empty()) {
    std::fprintf(stderr, "usage: fuzz_replay [--target NAME] [--all-targets] [--max-ms N] [--verbose] PATH...\n");
    return 2;
  }
  for (int sig : {SIGSEGV, SIGABRT, SIGILL, SIGBUS, SIGFPE, SIGTRAP}) ::signal(sig, on_fatal_signal);

  std::vector<job> jobs;
  for (const auto& p : paths) {
    const target* named = fs::is_directory(p) ? ckpt::fuzz::find_target(p.filename().string()) : nullptr;
    add_path(jobs, p, forced ? forced : named, all);
  }

  int slow = 0;
  double worst_ms = 0;
  std::string worst;
  for (const job& j : jobs) {
    std::ifstream in(j.file, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::snprintf(g_current, sizeof g_current, "%s (target %s)", j.file.c_str(), j.t->name);
    auto start = std::chrono::steady_clock::now();
    j.t->run(bytes.data(), bytes.size());
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (ms > worst_ms) {
      worst_ms = ms;
      worst = g_current;
    }
    if (verbose) std::printf("%8.2f ms  %s\n", ms, g_current);
    if (ms > double(max_ms)) {
      std::fprintf(stderr, "fuzz_replay: %s took %.0f ms (limit %ld ms)\n", g_current, ms, max_ms);
      ++slow;
    }
  }
  const auto& s = ckpt::fuzz::stats();
  std::printf("fuzz_replay: %zu runs, %d over %ld ms; slowest %.1f ms (%s); accepted %llu, written+re-read %llu, rekeyed %llu\n",
              jobs.size(), slow, max_ms, worst_ms, worst.c_str(), (unsigned long long)s.parsed,
              (unsigned long long)s.written, (unsigned long long)s.rekeyed);
  return slow ? 1 : 0;
}
