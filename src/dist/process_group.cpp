// The launcher's variables (as torch.distributed's env:// rendezvous reads them) and the
// one way a step's outcome is shared among ranks (ckpt/distributed.h).
#include "ckpt/distributed.h"

#include <cstdlib>
#include <new>
#include <optional>

#include <nlohmann/json.hpp>

#include "ckpt/error.h"

namespace ckpt {
namespace {

// A decimal integer in [lo, hi], nothing around it.
std::optional<long long> parse_int(const char* text, long long lo, long long hi) {
  if (!text || !*text) return std::nullopt;
  long long v = 0;
  for (const char* p = text; *p; ++p) {
    if (*p < '0' || *p > '9') return std::nullopt;
    v = v * 10 + (*p - '0');
    if (v > hi) return std::nullopt;
  }
  if (v < lo) return std::nullopt;
  return v;
}

[[noreturn]] void bad_launch(const std::string& what) {
  throw error(errc::usage, "launched for several processes, but " + what +
                               " (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)");
}

struct status {
  bool ok = true;
  errc kind = errc::io;
  std::string message;
};

std::string encode(const status& s) {
  nlohmann::json j = {{"ok", s.ok}, {"kind", int(s.kind)}, {"message", s.message}};
  return j.dump();
}

status decode(const std::string& bytes) {
  status s;
  try {
    const nlohmann::json j = nlohmann::json::parse(bytes);
    s.ok = j.at("ok").get<bool>();
    const int kind = j.at("kind").get<int>();
    if (kind < int(errc::check_failed) || kind > int(errc::device)) throw std::out_of_range("kind");
    s.kind = errc(kind);
    s.message = j.at("message").get<std::string>();
  } catch (const std::exception&) {
    // Only another ckptool build would send this: refuse it rather than guess.
    s = {false, errc::io, "sent a status this ckptool cannot read (another ckptool version?)"};
  }
  return s;
}

// Runs `work`; what it threw, as a status.
status attempt(const std::function<void()>& work) {
  status mine;
  try {
    work();
  } catch (const error& e) {
    mine = {false, e.kind(), e.one_line()};
  } catch (const std::bad_alloc&) {
    mine = {false, errc::io, "out of memory"};
  } catch (const std::exception& e) {
    mine = {false, errc::corrupt, std::string("internal error: ") + e.what()};
  }
  return mine;
}

// The lowest failing rank's error among every rank's status (this rank's is `mine`).
std::optional<error> first_failure(const std::vector<std::string>& all, int rank, const status& mine) {
  for (size_t r = 0; r < all.size(); ++r) {
    const status s = int(r) == rank ? mine : decode(all[r]);
    if (!s.ok) return error(s.kind, "rank " + std::to_string(r) + ": " + s.message);
  }
  return std::nullopt;
}

}  // namespace

std::optional<launch_info> launch_from(const std::function<const char*(const char*)>& getenv_fn) {
  const char* rank = getenv_fn("RANK");
  const char* world = getenv_fn("WORLD_SIZE");
  if ((!rank || !*rank) && (!world || !*world)) return std::nullopt;
  launch_info out;
  const auto w = parse_int(world, 1, 1 << 20);
  if (!w) bad_launch("WORLD_SIZE is " + (world ? "'" + std::string(world) + "'" : std::string("not set")));
  out.world = int(*w);
  const auto r = parse_int(rank, 0, out.world - 1);
  if (!r)
    bad_launch("RANK is " + (rank ? "'" + std::string(rank) + "'" : std::string("not set")) + " for WORLD_SIZE " +
               std::to_string(out.world));
  out.rank = int(*r);
  if (out.world == 1) return out;  // nothing to meet: the store is never used
  const char* addr = getenv_fn("MASTER_ADDR");
  const char* port = getenv_fn("MASTER_PORT");
  if (!addr || !*addr) bad_launch("MASTER_ADDR is not set");
  const auto p = parse_int(port, 1, 65535);
  if (!p) bad_launch("MASTER_PORT is " + (port ? "'" + std::string(port) + "'" : std::string("not set")));
  out.master_addr = addr;
  out.master_port = uint16_t(*p);
  const char* agent = getenv_fn("TORCHELASTIC_USE_AGENT_STORE");
  out.agent_store = agent && std::string(agent) == "True";
  const char* attempt = getenv_fn("TORCHELASTIC_RESTART_COUNT");
  if (attempt && *attempt) {
    if (!parse_int(attempt, 0, 1LL << 40)) bad_launch("TORCHELASTIC_RESTART_COUNT is '" + std::string(attempt) + "'");
    out.attempt = attempt;
  }
  return out;
}

std::optional<launch_info> launch_from_environment() {
  return launch_from([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

void run_collectively(process_group& group, const std::string& step, const std::function<void()>& work) {
  if (group.world() == 1) {
    work();
    return;
  }
  const status mine = attempt(work);
  if (std::optional<error> failed = first_failure(group.all_gather(step, encode(mine)), group.rank(), mine))
    throw *failed;
}

// The decision key holds "commit" (rank 0's) or "veto R" (rank R gave up), whichever came
// first; the outcome key, rank 0's status once it committed or failed.
void commit_collectively(process_group& group, const std::string& step, const std::function<void()>& ready,
                         const std::function<void()>& commit, const commit_settler& settled) {
  if (group.world() == 1) {
    ready();
    commit();
    return;
  }
  const int rank = group.rank();
  const std::string decision = step + "/decision";
  const std::string outcome = step + "/outcome";
  const std::string veto = "veto " + std::to_string(rank);
  // `failed`: a rank's `ready` failed, so rank 0 does not commit. `cut_off`: every `ready`
  // this rank heard of succeeded but the exchange itself broke; rank 0, if it heard every
  // rank, may have gone on to commit and been lost after.
  std::optional<error> failed;
  std::optional<error> cut_off;
  const status mine = attempt(ready);
  try {
    failed = first_failure(group.all_gather(step + "/ready", encode(mine)), rank, mine);
  } catch (const error& e) {
    if (mine.ok)
      cut_off = e;
    else
      failed = error(mine.kind, "rank " + std::to_string(rank) + ": " + mine.message);
  }

  if (rank == 0) {
    if (cut_off && !failed) failed = cut_off;
    status result;
    if (failed) {
      result = {false, failed->kind(), failed->message()};
    } else {
      const std::string d = group.decide(decision, "commit");
      if (d == "commit") {
        result = attempt(commit);
        if (!result.ok) result.message = "rank 0: " + result.message;
      } else
        result = {false, errc::io,
                  "rank " + d.substr(d.find(' ') + 1) + " gave up waiting for rank 0 to commit (rank 0 slower than "
                  "--dist-timeout, or a lost connection); nothing committed"};
    }
    // For a rank still waiting; one that left already learns nothing new from it.
    try {
      group.post(outcome, encode(result));
    } catch (const error&) {
    }
    if (failed) throw *failed;
    if (!result.ok) throw error(result.kind, result.message);
    return;
  }

  // This rank's veto: true when it came first (rank 0 will not commit), false when rank
  // 0's "commit" did, nullopt when the store is gone and with it the decision (rank 0
  // hosted it and is lost: it may have committed just before).
  auto vetoed = [&]() -> std::optional<bool> {
    try {
      return group.decide(decision, veto) != "commit";
    } catch (const error&) {
      return std::nullopt;
    }
  };
  const std::string waited = "rank " + std::to_string(rank) + " gave up on '" + step +
                             "' waiting for rank 0 to commit (lost, or slower than --dist-timeout)";
  // Rank 0 lost once it may have committed: returns when the file system says the output
  // is in place (rank 0's outcome, had it been heard); else throws `own` (this rank's
  // error) or "nothing committed" when it is not, "may or may not" when it cannot tell.
  auto settle = [&](const std::string& why, const std::optional<error>& own = std::nullopt) {
    const std::optional<bool> on_disk = settled ? settled() : std::nullopt;
    if (on_disk && *on_disk) return;
    if (on_disk && own) throw *own;
    if (on_disk) throw error(errc::io, waited + "; rank 0 is gone and nothing was committed" + why);
    throw error(errc::io, waited + " after it may have decided to commit" + why +
                              "; the output may or may not be complete, check it");
  };
  if (failed) {
    const std::optional<bool> v = vetoed();
    if (v && *v) throw *failed;
    // Rank 0 can have committed only if this rank's report reached it before the wait
    // here ended (a timeout): then the output is complete.
    if (!v) return settle(": " + failed->message(), failed);
  }
  if (cut_off) {
    const std::optional<bool> v = vetoed();
    if (v && *v) throw *cut_off;
    if (!v) return settle(": " + cut_off->message());
    // Rank 0 decided to commit: it heard every rank, and its outcome is this rank's.
  }
  std::optional<std::string> said;
  try {
    said = group.wait_for(outcome);
  } catch (const error& e) {
    const std::optional<bool> v = vetoed();
    if (v && *v) throw error(errc::io, waited + "; nothing committed: " + e.message());
    return settle(": " + e.message());
  }
  if (!said) {
    const std::optional<bool> v = vetoed();
    if (v && *v) throw error(errc::io, waited + "; nothing committed");
    // Rank 0 decided to commit before this rank gave up: its outcome is this rank's.
    try {
      said = group.wait_for(outcome);
    } catch (const error&) {
    }
    if (!said) return settle("");
  }
  const status s = decode(*said);
  if (!s.ok) throw error(s.kind, s.message);
}

}  // namespace ckpt
