// The process group of ckpt/distributed.h over c10d: a TCPStore for the rendezvous and
// c10d's StoreCollectives for the collectives.
//
// Why not ProcessGroupGloo: the collectives here carry a few hundred bytes of status per
// rank, once or twice per command, which is what StoreCollectives (c10d's own control-plane
// collectives, each with a timeout and an error naming the ranks that did not arrive) is
// for; and ProcessGroupGloo.hpp includes Gloo's headers, which PyPI's torch wheel does not
// ship. Tensor data never crosses the group: every rank reads and writes its own files.
#include "torch/c10d_group.h"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/control_collectives/StoreCollectives.hpp>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <cstdlib>
#include <thread>

#include "ckpt/error.h"

namespace ckpt {
namespace {

// c10d's messages run over several lines (a C++ backtrace after the first): the first
// line is the one that says what happened.
std::string first_line(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10 ? c10->what_without_backtrace() : e.what();
  const size_t nl = text.find('\n');
  if (nl != std::string::npos) text.resize(nl);
  return text;
}

// c10d's client retries a refused connection once a second: a rank that starts before
// rank 0 listens would lose up to a second. Waiting here for the port to accept, in steps
// of 10 ms, costs nothing and leaves the rendezvous itself to c10d.
void wait_until_listening(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool listening = false;
  while (!listening && std::chrono::steady_clock::now() < deadline) {
    for (addrinfo* a = found; a && !listening; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      listening = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
      ::close(fd);
    }
    if (!listening) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::freeaddrinfo(found);
}

std::vector<uint8_t> to_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string to_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

class c10d_group final : public process_group {
 public:
  c10d_group(const launch_info& launch, std::chrono::milliseconds timeout) : launch_(launch), timeout_(timeout) {
    // c10d logs its socket timeouts and retries to stderr as warnings; ckptool reports a
    // failure as one line of its own. TORCH_CPP_LOG_LEVEL, when set, still decides.
    if (!std::getenv("TORCH_CPP_LOG_LEVEL")) FLAGS_caffe2_log_level = 2;  // errors only
    const std::string where = launch.master_addr + ":" + std::to_string(launch.master_port);
    try {
      c10d::TCPStoreOptions opts;
      opts.port = launch.master_port;
      // As torch.distributed's env:// rendezvous: rank 0 hosts the store, shared with other
      // users of the port (multi-tenant), unless torchrun's agent already hosts it.
      opts.isServer = !launch.agent_store && launch.rank == 0;
      opts.numWorkers = size_t(launch.world);
      opts.waitWorkers = true;
      opts.timeout = timeout;
      opts.multiTenant = true;
      if (!opts.isServer) wait_until_listening(launch.master_addr, launch.master_port, timeout);
      store_ = c10::make_intrusive<c10d::TCPStore>(launch.master_addr, opts);
      // torchrun's store outlives a restart of the workers: each attempt has its own keys.
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("ckptool/" + launch.attempt, store_);
      prefixed_ = prefixed;
      collectives_ = c10::make_intrusive<c10d::StoreCollectives>(prefixed, launch.rank, launch.world);
    } catch (const std::exception& e) {
      throw error(errc::io, "rank " + std::to_string(launch.rank) + " of " + std::to_string(launch.world) +
                                ": cannot join the rendezvous store at " + where + " within " + seconds() + ": " +
                                first_line(e));
    }
  }

  // When rank 0 hosts the store, it must outlive every other rank's last read from it:
  // each rank says it is leaving, and rank 0 waits for them (bounded) before the store
  // goes away with it.
  ~c10d_group() override {
    if (launch_.agent_store || !prefixed_) return;
    try {
      if (launch_.rank != 0) {
        prefixed_->add("left", 1);
        return;
      }
      const auto deadline = std::chrono::steady_clock::now() + std::min(timeout_, std::chrono::milliseconds(30000));
      while (prefixed_->add("left", 0) < launch_.world - 1 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } catch (const std::exception&) {
      // A rank already gone: nothing left to wait for.
    }
  }

  int rank() const override { return launch_.rank; }
  int world() const override { return launch_.world; }

  std::vector<std::string> all_gather(const std::string& step, const std::string& bytes) override {
    return guarded(step, [&] {
      std::vector<std::string> out;
      for (const auto& v : collectives_->allGather(step, to_bytes(bytes), timeout_)) out.push_back(to_string(v));
      return out;
    });
  }

  std::string broadcast(const std::string& step, const std::string& bytes) override {
    return guarded(step, [&] {
      if (launch_.rank == 0) {
        collectives_->broadcastSend(step, to_bytes(bytes), timeout_);
        return bytes;
      }
      return to_string(collectives_->broadcastRecv(step, timeout_));
    });
  }

  void barrier(const std::string& step) override {
    guarded(step, [&] {
      collectives_->barrier(step, timeout_);
      return 0;
    });
  }

  // Plain keys of their own, apart from StoreCollectives' (which each take a key once).
  std::string decide(const std::string& key, const std::string& proposal) override {
    return guarded(key, [&] { return to_string(prefixed_->compareSet("decide/" + key, {}, to_bytes(proposal))); });
  }

  void post(const std::string& key, const std::string& value) override {
    guarded(key, [&] {
      prefixed_->set("decide/" + key, to_bytes(value));
      return 0;
    });
  }

  std::optional<std::string> wait_for(const std::string& key) override {
    const std::string k = "decide/" + key;
    try {
      prefixed_->wait({k}, timeout_);
    } catch (const std::exception&) {
      // A timeout, or a lost store: check() tells them apart (it throws on the latter).
    }
    return guarded(key, [&]() -> std::optional<std::string> {
      if (!prefixed_->check({k})) return std::nullopt;
      return to_string(prefixed_->get(k));
    });
  }

 private:
  std::string seconds() const {
    return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout_).count()) + " s";
  }

  template <typename F>
  auto guarded(const std::string& step, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const std::exception& e) {
      // A rank that died, hung or lost its connection: every rank still waiting ends here.
      throw error(errc::io, "rank " + std::to_string(launch_.rank) + " gave up on '" + step + "' after waiting up to " +
                                seconds() + " for the other ranks (lost, or slower than --dist-timeout): " +
                                first_line(e));
    }
  }

  launch_info launch_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Store> prefixed_;
  c10::intrusive_ptr<c10d::StoreCollectives> collectives_;
};

}  // namespace

std::unique_ptr<process_group> open_c10d_group(const launch_info& launch, std::chrono::milliseconds timeout) {
  return std::make_unique<c10d_group>(launch, timeout);
}

}  // namespace ckpt
