// The processes of one command run by a launcher (torchrun, or any launcher that sets
// RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT), and the few collectives parallel convert
// and verify need: an all-gather of small byte strings and a broadcast from rank 0. They
// carry statuses and names, never tensor data: every rank reads and writes its own files.
// docs/distributed.md describes the commands built on it.
//
// Two implementations: single_process below (world 1, every collective returns at once:
// the commands then behave as they always did), and one over LibTorch's c10d in the torch
// plugin (src/torch/c10d_group.cpp), which a command loads only when launched with
// WORLD_SIZE > 1.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ckpt {

/// What the launcher tells this process.
struct launch_info {
  int rank = 0;
  int world = 1;
  std::string master_addr;  // the host of the rendezvous store
  uint16_t master_port = 0;
  /// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts the store, every rank is
  /// its client; otherwise rank 0 hosts it (torch.distributed's env:// rendezvous).
  bool agent_store = false;
  /// TORCHELASTIC_RESTART_COUNT ("0" without it): an agent's store outlives a restart, so
  /// each attempt keeps its keys apart.
  std::string attempt = "0";
};

/// The launcher's variables: nullopt when neither RANK nor WORLD_SIZE is set. Throws
/// errc::usage when they are incomplete or inconsistent (a rank outside the world, a
/// MASTER_PORT that is no port, WORLD_SIZE > 1 without MASTER_ADDR/MASTER_PORT).
std::optional<launch_info> launch_from_environment();
/// The same from a lookup function (tests).
std::optional<launch_info> launch_from(const std::function<const char*(const char*)>& getenv_fn);

/// Every rank calls each collective, in the same order, with the same `step` name (unique
/// within the command). A rank that does not arrive within the group's timeout, or whose
/// connection is lost, ends the collective on every other rank with errc::io naming it.
class process_group {
 public:
  virtual ~process_group() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  /// Every rank's `bytes`, in rank order.
  virtual std::vector<std::string> all_gather(const std::string& step, const std::string& bytes) = 0;
  /// Rank 0's `bytes`, on every rank (the other ranks' argument is not used).
  virtual std::string broadcast(const std::string& step, const std::string& bytes) = 0;
  /// Returns once every rank has called it.
  virtual void barrier(const std::string& step) = 0;
  /// Sets `key` to `proposal` unless some rank set it first, atomically (a compare-and-set
  /// in the rendezvous store); returns its value either way. Does not wait for other ranks:
  /// ranks that no longer hear from each other in time still agree on one value.
  virtual std::string decide(const std::string& key, const std::string& proposal) = 0;
  /// Sets `key` (for wait_for), whatever it held.
  virtual void post(const std::string& key, const std::string& value) = 0;
  /// `key`'s value once some rank set it (decide or post); nullopt when none did within
  /// the group's timeout.
  virtual std::optional<std::string> wait_for(const std::string& key) = 0;
};

/// One process alone.
class single_process final : public process_group {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  std::vector<std::string> all_gather(const std::string&, const std::string& bytes) override { return {bytes}; }
  std::string broadcast(const std::string&, const std::string& bytes) override { return bytes; }
  void barrier(const std::string&) override {}
  std::string decide(const std::string& key, const std::string& proposal) override {
    return values_.emplace(key, proposal).first->second;
  }
  void post(const std::string& key, const std::string& value) override { values_[key] = value; }
  std::optional<std::string> wait_for(const std::string& key) override {
    const auto it = values_.find(key);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::map<std::string, std::string> values_;
};

/// Runs `work` on this rank, then tells every rank how every rank did. Returns on every
/// rank when all succeeded; otherwise every rank throws the same ckpt::error, that of the
/// lowest failing rank: its kind, and "rank R: " before its one-line message (the message
/// alone in a group of one, so a single process reports exactly what it always did).
/// `work` may throw anything; what is not a ckpt::error counts as errc::io (out of memory)
/// or an internal error (errc::corrupt, as cli/main.cpp reports one).
void run_collectively(process_group& group, const std::string& step, const std::function<void()>& work);

/// The last step of a command whose output rank 0 alone commits (docs/distributed.md,
/// "Steps and failure semantics"): `ready` on every rank (its files written and synced), as
/// run_collectively; then, only if every rank reported success, `commit` on rank 0. Every
/// rank returns, or every rank throws, even when a rank's wait ends by timeout just as the
/// others finish: a rank that gives up (a timeout, a failed `ready`) first vetoes the commit
/// with decide(), and rank 0 commits only if its own decide() came first; a rank whose veto
/// came too late waits for rank 0's outcome and takes it as its own. So a rank never exits
/// non-zero while rank 0 commits, and never 0 while it does not. A rank that gave up
/// throws errc::io naming itself; rank 0, vetoed, throws errc::io naming the rank that gave
/// up; a failed `ready` or `commit` is thrown on every rank as run_collectively throws it.
/// Rank 0 lost once it may have decided to commit (a SIGKILL in the rename; the store gone
/// with it, so its decision cannot be read) is settled on the other ranks by `settled`,
/// asked there only: true when the output is committed and stays so (the rank returns as
/// if rank 0 had said so), false when it is not and never will be (errc::io, "nothing
/// committed"), nullopt when it cannot tell (errc::io saying that the output may or may not
/// be complete). Unset: nullopt.
using commit_settler = std::function<std::optional<bool>()>;
void commit_collectively(process_group& group, const std::string& step, const std::function<void()>& ready,
                         const std::function<void()>& commit, const commit_settler& settled = {});

}  // namespace ckpt
