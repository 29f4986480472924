// The launcher's variables (as torch.distributed's env:// rendezvous reads them) and the
// one way a step's outcome is shared among ranks (ckpt/distributed.h).
#include "ckpt/distributed.h"

#include <cstdlib>
#include <new>

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
  const std::vector<std::string> all = group.all_gather(step, encode(mine));
  for (size_t r = 0; r < all.size(); ++r) {
    const status s = int(r) == group.rank() ? mine : decode(all[r]);
    if (!s.ok) throw error(s.kind, "rank " + std::to_string(r) + ": " + s.message);
  }
}

}  // namespace ckpt
