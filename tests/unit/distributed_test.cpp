// The process-group plumbing of parallel convert and verify (ckpt/distributed.h,
// ckpt/parallel_convert.h) without LibTorch: the launcher's variables, how a step's failure
// reaches every rank (ranks as threads over an in-memory group), and who writes which file.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "ckpt/distributed.h"
#include "ckpt/error.h"
#include "ckpt/parallel_convert.h"

namespace {

// Ranks as threads: each collective waits until every rank has put its bytes.
struct exchange {
  explicit exchange(int world) : world(world) {}
  int world;
  std::mutex m;
  std::condition_variable cv;
  std::map<std::string, std::vector<std::string>> steps;

  std::vector<std::string> put(const std::string& step, int rank, const std::string& bytes) {
    std::unique_lock<std::mutex> lock(m);
    auto& slots = steps[step];
    if (slots.empty()) slots.assign(size_t(world), std::string("\x01unset"));
    slots[size_t(rank)] = bytes;
    cv.notify_all();
    cv.wait(lock, [&] {
      for (const auto& s : slots)
        if (s == "\x01unset") return false;
      return true;
    });
    return slots;
  }

  // The store's plain keys (decide, post, wait_for).
  std::map<std::string, std::string> keys;
  // The store gone with the rank that hosted it (rank 0 launched by hand, killed): every
  // key operation fails from then on.
  bool gone = false;
  void check_store() const {
    if (gone) throw ckpt::error(ckpt::errc::io, "connection to the store lost");
  }
  void lose_store() {
    std::lock_guard<std::mutex> lock(m);
    gone = true;
    cv.notify_all();
  }
  void wait_until_gone() {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return gone; });
  }
  std::string decide(const std::string& key, const std::string& proposal) {
    std::lock_guard<std::mutex> lock(m);
    check_store();
    const std::string v = keys.emplace(key, proposal).first->second;
    cv.notify_all();
    return v;
  }
  void post(const std::string& key, const std::string& value) {
    std::lock_guard<std::mutex> lock(m);
    check_store();
    keys[key] = value;
    cv.notify_all();
  }
  std::optional<std::string> wait_for(const std::string& key, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(m);
    if (!cv.wait_for(lock, timeout, [&] { return gone || keys.count(key) > 0; })) return std::nullopt;
    check_store();
    return keys[key];
  }
};

class thread_group final : public ckpt::process_group {
 public:
  thread_group(exchange& x, int rank) : x_(x), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return x_.world; }
  std::vector<std::string> all_gather(const std::string& step, const std::string& bytes) override {
    std::vector<std::string> all = x_.put(step, rank_, bytes);
    // Its bytes are in, but the store goes (with rank 0) before it reads the others'.
    if (late_reader) {
      x_.wait_until_gone();
      throw ckpt::error(ckpt::errc::io, "gave up on '" + step + "': Broken pipe");
    }
    return all;
  }
  std::string broadcast(const std::string& step, const std::string& bytes) override {
    return x_.put(step, rank_, bytes)[0];
  }
  void barrier(const std::string& step) override { x_.put(step, rank_, ""); }
  std::string decide(const std::string& key, const std::string& proposal) override {
    // A rank 0 slower than the others' timeout, between its `ready` and its decision.
    if (rank_ == 0) std::this_thread::sleep_for(decide_delay);
    return x_.decide(key, proposal);
  }
  void post(const std::string& key, const std::string& value) override { x_.post(key, value); }
  std::optional<std::string> wait_for(const std::string& key) override { return x_.wait_for(key, timeout); }

  std::chrono::milliseconds timeout{5000};
  std::chrono::milliseconds decide_delay{0};
  bool late_reader = false;

 private:
  exchange& x_;
  int rank_;
};

struct outcome {
  bool threw = false;
  ckpt::errc kind = ckpt::errc::io;
  std::string message;
};

// Runs `work(rank)` as one step on `world` thread ranks; what each rank saw.
std::vector<outcome> run_step(int world, const std::function<void(int)>& work) {
  exchange x(world);
  std::vector<outcome> out(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      thread_group g(x, r);
      try {
        ckpt::run_collectively(g, "step", [&] { work(r); });
      } catch (const ckpt::error& e) {
        out[size_t(r)] = {true, e.kind(), e.one_line()};
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

std::optional<ckpt::launch_info> launch(std::map<std::string, std::string> env) {
  return ckpt::launch_from([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

ckpt::errc launch_refusal(std::map<std::string, std::string> env) {
  try {
    launch(env);
  } catch (const ckpt::error& e) {
    return e.kind();
  }
  FAIL("accepted");
  return ckpt::errc::io;
}

}  // namespace

TEST_CASE("launch: absent, torchrun's variables, and what is refused") {
  CHECK_FALSE(launch({}).has_value());
  const auto one = launch({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  REQUIRE(one);
  CHECK(one->world == 1);
  const auto l = launch({{"RANK", "2"},
                         {"WORLD_SIZE", "3"},
                         {"MASTER_ADDR", "127.0.0.1"},
                         {"MASTER_PORT", "29500"},
                         {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                         {"TORCHELASTIC_RESTART_COUNT", "1"}});
  REQUIRE(l);
  CHECK(l->rank == 2);
  CHECK(l->world == 3);
  CHECK(l->master_addr == "127.0.0.1");
  CHECK(l->master_port == 29500);
  CHECK(l->agent_store);
  CHECK(l->attempt == "1");
  CHECK_FALSE(launch({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})->agent_store);

  CHECK(launch_refusal({{"RANK", "0"}}) == ckpt::errc::usage);
  CHECK(launch_refusal({{"WORLD_SIZE", "2"}}) == ckpt::errc::usage);
  CHECK(launch_refusal({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}) ==
        ckpt::errc::usage);
  CHECK(launch_refusal({{"RANK", "-1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}) ==
        ckpt::errc::usage);
  CHECK(launch_refusal({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}) == ckpt::errc::usage);
  CHECK(launch_refusal({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}) ==
        ckpt::errc::usage);
  CHECK(launch_refusal({{"RANK", "0"}, {"WORLD_SIZE", "2x"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}) ==
        ckpt::errc::usage);
}

TEST_CASE("run_collectively: every rank succeeds") {
  for (const auto& o : run_step(3, [](int) {})) CHECK_FALSE(o.threw);
}

TEST_CASE("run_collectively: one rank's error is every rank's, naming that rank") {
  const auto seen = run_step(3, [](int r) {
    if (r == 1) throw ckpt::error(ckpt::errc::corrupt, "bad bytes", 12).with_file("x.distcp");
  });
  for (const auto& o : seen) {
    CHECK(o.threw);
    CHECK(o.kind == ckpt::errc::corrupt);
    CHECK(o.message == "rank 1: x.distcp: byte 12: bad bytes");
  }
}

TEST_CASE("run_collectively: the lowest failing rank is the one reported, whatever else failed") {
  const auto seen = run_step(4, [](int r) {
    if (r == 3) throw ckpt::error(ckpt::errc::io, "disk full");
    if (r == 2) throw std::runtime_error("boom");
  });
  for (const auto& o : seen) {
    CHECK(o.threw);
    CHECK(o.kind == ckpt::errc::corrupt);  // an internal error, as cli/main.cpp reports one
    CHECK(o.message == "rank 2: internal error: boom");
  }
}

TEST_CASE("run_collectively: one process alone throws what it always threw") {
  ckpt::single_process g;
  try {
    ckpt::run_collectively(g, "s", [] { throw ckpt::error(ckpt::errc::usage, "bad flag"); });
    FAIL("no throw");
  } catch (const ckpt::error& e) {
    CHECK(e.one_line() == "bad flag");
  }
}

TEST_CASE("assign_files: largest first to the least loaded rank, the index to rank 0") {
  // Shards of 5, 5, 4, 3, 3 bytes and the index.
  const std::vector<uint64_t> bytes{5, 5, 4, 3, 3, 0};
  CHECK(ckpt::assign_files(bytes, 2) == std::vector<int>{0, 1, 0, 1, 1, 0});  // 9 and 11 bytes
  CHECK(ckpt::assign_files(bytes, 3) == std::vector<int>{0, 1, 2, 2, 0, 0});  // 8, 5 and 7
  CHECK(ckpt::assign_files(bytes, 1) == std::vector<int>(6, 0));
  // One file (no index): rank 0's, however many ranks.
  CHECK(ckpt::assign_files({7}, 4) == std::vector<int>{0});
  // More ranks than shards: some ranks write nothing.
  CHECK(ckpt::assign_files({2, 1, 0}, 4) == std::vector<int>{0, 1, 0});
}

namespace {

// commit_collectively on `world` thread ranks; what each saw, and how many commits ran.
std::vector<outcome> run_commit(int world, const std::function<void(int)>& ready, int* commits,
                                std::chrono::milliseconds timeout, std::chrono::milliseconds decide_delay) {
  exchange x(world);
  std::vector<outcome> out(static_cast<size_t>(world));
  std::atomic<int> committed{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      thread_group g(x, r);
      g.timeout = timeout;
      g.decide_delay = decide_delay;
      try {
        ckpt::commit_collectively(g, "c", [&] { ready(r); }, [&] { ++committed; });
      } catch (const ckpt::error& e) {
        out[size_t(r)] = {true, e.kind(), e.one_line()};
      }
    });
  for (auto& t : threads) t.join();
  *commits = committed;
  return out;
}

}  // namespace

TEST_CASE("commit_collectively: every rank ready, rank 0 commits once, every rank returns") {
  int commits = 0;
  for (const auto& o : run_commit(3, [](int) {}, &commits, std::chrono::milliseconds(5000), {})) CHECK_FALSE(o.threw);
  CHECK(commits == 1);
}

TEST_CASE("commit_collectively: a rank that fails its ready step: no commit, every rank throws its error") {
  int commits = 0;
  const auto seen = run_commit(
      3, [](int r) { if (r == 2) throw ckpt::error(ckpt::errc::io, "disk full"); }, &commits,
      std::chrono::milliseconds(5000), {});
  CHECK(commits == 0);
  for (const auto& o : seen) {
    CHECK(o.threw);
    CHECK(o.kind == ckpt::errc::io);
    CHECK(o.message == "rank 2: disk full");
  }
}

TEST_CASE("commit_collectively: a rank that gives up waiting vetoes a commit that had not begun") {
  // Rank 0 decides 300 ms after the ready step; the others wait 50 ms for its outcome.
  int commits = 0;
  const auto seen =
      run_commit(3, [](int) {}, &commits, std::chrono::milliseconds(50), std::chrono::milliseconds(300));
  CHECK(commits == 0);
  for (size_t r = 0; r < seen.size(); ++r) {
    CHECK(seen[r].threw);
    CHECK(seen[r].kind == ckpt::errc::io);
  }
  CHECK(seen[0].message.find("gave up waiting for rank 0 to commit") != std::string::npos);
  CHECK(seen[0].message.find("nothing committed") != std::string::npos);
  CHECK(seen[1].message.find("rank 1 gave up on 'c' waiting for rank 0 to commit") == 0);
}

TEST_CASE("commit_collectively: a veto that comes after rank 0's decision waits for its outcome") {
  // Rank 0 decides at once and its commit takes 300 ms; the others' first wait (50 ms)
  // ends first, their veto loses, and they take rank 0's outcome (success) as theirs.
  int commits = 0;
  exchange x(2);
  std::vector<outcome> seen(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      thread_group g(x, r);
      g.timeout = std::chrono::milliseconds(r == 0 ? 5000 : 200);
      try {
        ckpt::commit_collectively(g, "c", [] {}, [&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          ++commits;
        });
      } catch (const ckpt::error& e) {
        seen[size_t(r)] = {true, e.kind(), e.one_line()};
      }
    });
  for (auto& t : threads) t.join();
  CHECK(commits == 1);
  CHECK_FALSE(seen[0].threw);
  CHECK_FALSE(seen[1].threw);
}

namespace {

// Rank 0 decides to commit and, in its commit, is lost with the store it hosted, before it
// can say how the commit went; the other ranks ask `settler`. What ranks 1 and 2 saw.
// `late_readers`: ranks 1 and 2 are still reading the ready exchange when the store goes
// (rank 0 heard every rank first), so they never learn that every rank was ready.
std::vector<outcome> lost_in_commit(const ckpt::commit_settler& settler, bool late_readers = false) {
  exchange x(3);
  std::vector<outcome> seen(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      thread_group g(x, r);
      g.late_reader = late_readers && r != 0;
      try {
        ckpt::commit_collectively(g, "c", [] {}, [&] { x.lose_store(); }, settler);
      } catch (const ckpt::error& e) {
        seen[size_t(r)] = {true, e.kind(), e.one_line()};
      }
    });
  for (auto& t : threads) t.join();
  return {seen[1], seen[2]};
}

}  // namespace

TEST_CASE("commit_collectively: rank 0 lost with the store in its commit: the others ask the file system") {
  // Whether or not ranks 1 and 2 had read the ready exchange before the store went: the
  // rename can have happened either way.
  for (const bool late_readers : {false, true}) {
    CAPTURE(late_readers);
    for (const auto& o : lost_in_commit([] { return std::optional<bool>(true); }, late_readers))
      CHECK_FALSE(o.threw);  // committed: they return as rank 0 would have told them

    const auto seen = lost_in_commit([] { return std::optional<bool>(false); }, late_readers);
    for (size_t i = 0; i < seen.size(); ++i) {  // not committed, for good
      CHECK(seen[i].threw);
      CHECK(seen[i].kind == ckpt::errc::io);
      CHECK(seen[i].message.find("rank " + std::to_string(i + 1) + " gave up on 'c'") == 0);
      CHECK(seen[i].message.find("rank 0 is gone and nothing was committed") != std::string::npos);
    }

    // No way to tell (no settler, or it cannot): may or may not, never "nothing committed".
    for (const ckpt::commit_settler& settler :
         {ckpt::commit_settler(), ckpt::commit_settler([] { return std::optional<bool>(); })}) {
      for (const auto& o : lost_in_commit(settler, late_readers)) {
        CHECK(o.threw);
        CHECK(o.kind == ckpt::errc::io);
        CHECK(o.message.find("may or may not be complete") != std::string::npos);
        CHECK(o.message.find("nothing committed") == std::string::npos);
      }
    }
  }
}
