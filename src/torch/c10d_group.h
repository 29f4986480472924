// ckpt::process_group over LibTorch's c10d (ckpt/distributed.h), built into the torch plugin
// so that only a command launched for several processes loads LibTorch.
#pragma once

#include <chrono>
#include <memory>

#include "ckpt/distributed.h"

namespace ckpt {

/// Joins the launcher's rendezvous store: a c10d::TCPStore at MASTER_ADDR:MASTER_PORT,
/// hosted by rank 0, or by torchrun's agent when `launch.agent_store`. A collective waits
/// at most `timeout` for the other ranks. Throws errc::io when the store cannot be reached
/// or not every rank joins within `timeout`.
std::unique_ptr<process_group> open_c10d_group(const launch_info& launch, std::chrono::milliseconds timeout);

}  // namespace ckpt
