#include "distributed.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "plugin/torch_plugin.h"

namespace cli {
namespace {
bool joined = false;
}  // namespace

bool joined_a_group() { return joined; }

void add_distributed_flags(CLI::App& cmd, distributed_flags& flags) {
  cmd.add_option("--dist-timeout", flags.timeout_seconds,
                 "Under torchrun: how long a rank waits for the others at each step before it gives up on a lost "
                 "rank (exit 4)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 86400u))
      ->type_name("SECONDS")
      ->group("Parallel (torchrun)");
}

std::unique_ptr<ckpt::process_group> open_process_group(const distributed_flags& flags) {
  const auto launch = ckpt::launch_from_environment();
  if (!launch || launch->world == 1) return std::make_unique<ckpt::single_process>();
  // One report, from rank 0; the others' warnings would repeat it.
  if (launch->rank != 0) spdlog::set_level(spdlog::level::err);
  auto group = ckpt::torch_plugin().open_process_group(*launch, std::chrono::seconds(flags.timeout_seconds));
  joined = true;
  return group;
}

}  // namespace cli
