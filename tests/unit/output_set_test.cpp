// ckpt::output_set: conflicts refused up front, outputs committed together with rollback,
// inputs fingerprinted, temporary files visible to a signal handler, and no signal handler
// of the library's own. End-to-end cases (devices, FIFOs, signals) are in
// tests/py/test_output_policy.py.
#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/output_set.h"

using ckpt::errc;

namespace {

// A scratch directory, removed (one level deep) when the test ends.
struct scratch {
  std::string dir;
  scratch() {
    char tmpl[] = "/tmp/ckpt_output_set_XXXXXX";
    dir = ::mkdtemp(tmpl);
  }
  ~scratch() {
    for (const auto& n : names()) ::unlink((dir + "/" + n).c_str()), ::rmdir((dir + "/" + n).c_str());
    ::rmdir(dir.c_str());
  }
  std::string operator/(const std::string& name) const { return dir + "/" + name; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    DIR* d = ::opendir(dir.c_str());
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
    ::closedir(d);
    return out;
  }
  size_t temporaries() const {
    size_t n = 0;
    for (const auto& name : names())
      if (name[0] == '.' && name.find(".ckptool-") != std::string::npos) ++n;
    return n;
  }
};

void put(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string get(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

errc kind_of_failure(const std::function<void()>& f) {
  try {
    f();
  } catch (const ckpt::error& e) {
    return e.kind();
  }
  FAIL("no error thrown");
  return errc::io;
}

}  // namespace

TEST_CASE("output_set: outputs appear together at commit, with the input's mode") {
  scratch s;
  put(s / "in", "input");
  ::chmod((s / "in").c_str(), 0600);
  put(s / "b", "old b");
  ckpt::output_set set;
  ckpt::file_fingerprint in = set.add_input(s / "in");
  ckpt::output_file& a = set.add_output(s / "a", in.mode & 0777);
  ckpt::output_file& b = set.add_output(s / "b", in.mode & 0777);
  set.open();
  a.write("new a", 5);
  b.write("new b", 5);
  CHECK(::access((s / "a").c_str(), F_OK) != 0);
  CHECK(get(s / "b") == "old b");
  CHECK(s.temporaries() == 2);
  set.commit();
  CHECK(get(s / "a") == "new a");
  CHECK(get(s / "b") == "new b");
  struct stat st;
  REQUIRE(::stat((s / "a").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(s.temporaries() == 0);
}

TEST_CASE("output_set: a failed rename puts back every output already renamed") {
  scratch s;
  put(s / "a", "old a");
  {
    ckpt::output_set set;
    ckpt::output_file& a = set.add_output(s / "a");
    ckpt::output_file& b = set.add_output(s / "b");
    set.open();
    a.write("new a", 5);
    b.write("new b", 5);
    // The second output's temporary file vanishes: its rename fails after the first's.
    ::unlink(b.temp_path().c_str());
    CHECK(kind_of_failure([&] { set.commit(); }) == errc::io);
  }
  CHECK(get(s / "a") == "old a");
  CHECK(::access((s / "b").c_str(), F_OK) != 0);
  CHECK(s.temporaries() == 0);
}

TEST_CASE("output_set: without commit nothing is replaced and no temporary remains") {
  scratch s;
  put(s / "a", "old a");
  {
    ckpt::output_set set;
    set.add_output(s / "a").fd();
    set.open();
    CHECK(s.temporaries() == 1);
  }
  CHECK(get(s / "a") == "old a");
  CHECK(s.temporaries() == 0);
}

TEST_CASE("output_set: an input that changed is refused at commit") {
  scratch s;
  put(s / "in", "input");
  ckpt::output_set set;
  set.add_input(s / "in");
  ckpt::output_file& a = set.add_output(s / "a");
  set.open();
  a.write("x", 1);
  put(s / "in", "input, longer");
  CHECK(kind_of_failure([&] { set.commit(); }) == errc::io);
  CHECK(::access((s / "a").c_str(), F_OK) != 0);
}

TEST_CASE("output_set: an input named as an output, however spelled, is refused up front") {
  scratch s;
  put(s / "in", "input");
  ::mkdir((s / "sub").c_str(), 0755);
  ::symlink("in", (s / "sym").c_str());
  ::link((s / "in").c_str(), (s / "hard").c_str());
  for (const std::string& spelled : {s / "in", s.dir + "//in", s / "sub/../in", s / "./in", s / "sym", s / "hard"}) {
    ckpt::output_set set;
    set.add_input(s / "in");
    CAPTURE(spelled);
    CHECK(kind_of_failure([&] { set.add_output(spelled); }) == errc::usage);
  }
  // Two outputs that are one file, though neither exists yet.
  ckpt::output_set set;
  set.add_output(s / "new");
  CHECK(kind_of_failure([&] { set.add_output(s / "sub/../new"); }) == errc::usage);
  // What --force allows: the one named input.
  ckpt::output_set forced;
  forced.add_input(s / "in");
  CHECK_NOTHROW(forced.add_output(s / "sym", 0644, s / "in"));
  CHECK(get(s / "in") == "input");
}

TEST_CASE("output_set: directories and empty names are refused; FIFO inputs at once") {
  scratch s;
  ckpt::output_set set;
  CHECK(kind_of_failure([&] { set.add_output(""); }) == errc::usage);
  CHECK(kind_of_failure([&] { set.add_output(s.dir); }) == errc::usage);
  CHECK(kind_of_failure([&] { set.add_output(s.dir + "/"); }) == errc::usage);
  CHECK(kind_of_failure([&] { set.add_output(s / "."); }) == errc::usage);
  REQUIRE(::mkfifo((s / "fifo").c_str(), 0600) == 0);
  CHECK(kind_of_failure([&] { set.add_input(s / "fifo"); }) == errc::usage);
  CHECK(kind_of_failure([&] { set.add_input(s / "missing"); }) == errc::io);
}

TEST_CASE("output_set: a symlink output keeps the link and replaces its target") {
  scratch s;
  put(s / "target", "old");
  ::symlink("target", (s / "link").c_str());
  ckpt::output_set set;
  ckpt::output_file& o = set.add_output(s / "link");
  set.open();
  o.write("new", 3);
  set.commit();
  struct stat st;
  REQUIRE(::lstat((s / "link").c_str(), &st) == 0);
  CHECK(S_ISLNK(st.st_mode));
  CHECK(get(s / "target") == "new");
}

TEST_CASE("output_set: temporaries are removable from a signal handler; no handler installed") {
  scratch s;
  struct sigaction before;
  ::sigaction(SIGINT, nullptr, &before);
  ckpt::output_set set;
  set.add_output(s / "a");
  set.add_output(s / "b");
  set.open();
  struct sigaction after;
  ::sigaction(SIGINT, nullptr, &after);
  CHECK((after.sa_handler == before.sa_handler));
  CHECK(s.temporaries() == 2);
  ckpt::remove_temporaries_in_progress();
  CHECK(s.temporaries() == 0);
}
