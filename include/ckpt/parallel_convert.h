// `convert --to hf` and `--to dcp` by several processes (docs/distributed.md): the shard set's files are
// divided among the ranks of a process group, each written by one rank into one staging
// directory that rank 0 creates, and rank 0 commits the set only once every rank reported
// its files complete.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/convert.h"
#include "ckpt/distributed.h"
#include "ckpt/output_dir.h"

namespace ckpt {

/// Which rank writes each file: the largest first, each to the rank with the fewest bytes
/// so far (the lowest such rank), so that ranks finish together; the last file (a set's
/// index, which rank 0 writes as it commits the set) to rank 0. Deterministic: every rank
/// computes the same answer from the same plan.
std::vector<int> assign_files(const std::vector<uint64_t>& bytes, int world);

/// write_converted_hf_set and the commit, by every rank of `group` with the same plan
/// (the same input, request and flags). `out` is rank 0's output directory, not yet
/// open()ed (null on the other ranks); `files` are hf_set_files' names. Rank 0 opens it
/// (every refusal of ckpt/output_dir.h) and hands its staging directory to the others,
/// every rank writes its files there and then runs `before_commit` (the caller's checks:
/// its inputs unchanged), and once all succeeded rank 0 commits. Any rank's error is thrown
/// on every rank (run_collectively), and then rank 0's `out` removes the staging directory
/// with every file in it: no partial output. Returns on every rank the files of the whole
/// set and the bytes all ranks wrote.
convert_result write_converted_hf_set(process_group& group, const checkpoint& c, const convert_plan& plan,
                                      output_dir* out, const std::vector<std::string>& files,
                                      const convert_request& request, const std::function<void()>& before_commit);

/// write_converted_dcp and the commit, by every rank of `group`, as write_converted_hf_set
/// above: the K rank files of the layout (request.ranks, request.placements) are divided by
/// assign_files (bytes per file), each written by one rank; every rank reports where its
/// items landed, and rank 0 writes `.metadata` from all of them and commits. The directory
/// is byte for byte the single process's but for `.metadata`'s random save_id.
convert_result write_converted_dcp(process_group& group, const checkpoint& c, const convert_plan& plan, output_dir* out,
                                   const std::vector<std::string>& files, const convert_request& request,
                                   const std::function<void()>& before_commit);

}  // namespace ckpt
