// Internal: what to read to load a selection of a checkpoint's storages, as one ordered
// list of coalesced reads. Every loader executes such a plan (the CPU loader, the --mmap
// populate pass, the CUDA staging ring) instead of deciding the order and the coalescing
// itself, so a new byte layout (shards, chunks) is taught to the planner once.
//
// A read covers file bytes [offset, offset + nbytes) and lands them as pieces: each piece
// is a byte range of the read that belongs to one storage at one offset in it. Bytes of a
// read that no piece claims are gaps (a zip local header between two records): read and
// thrown away, because one longer read costs less than two system calls and two copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "ckpt/checkpoint.h"

namespace ckpt::detail {

struct read_piece {
  size_t storage;           // index into checkpoint::storages
  uint64_t storage_offset;  // where in the storage the piece goes
  uint64_t read_offset;     // where in its read the piece starts
  uint64_t nbytes;
};

struct read_op {
  uint32_t file = 0;  // index into checkpoint::files
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  size_t first_piece = 0;  // pieces [first_piece, first_piece + piece_count) of read_plan::pieces
  size_t piece_count = 0;
};

struct read_plan {
  std::vector<read_op> reads;      // ascending (file, offset); none longer than max_read
  std::vector<read_piece> pieces;  // grouped by read, ascending within one
  /// Every selected storage once, ascending: the destinations an executor allocates.
  /// Zero-length storages and storages without data in the file are here but in no read.
  std::vector<size_t> storages;
  uint64_t storage_bytes = 0;  // bytes the pieces land (gaps not counted): progress' total
};

struct read_plan_options {
  /// Most bytes between two storages that one read spans (read, then discarded).
  uint64_t max_gap = 4096;
  /// No read is longer. A longer storage is cut at file offsets that are multiples of
  /// max_read, so every cut is page-aligned in a destination congruent to the file.
  uint64_t max_read = 64ull << 20;
  /// A read that serves several storages spans at most this many bytes.
  uint64_t max_shared_read = std::numeric_limits<uint64_t>::max();
  /// Only storages shorter than this share a read with others.
  uint64_t share_below = std::numeric_limits<uint64_t>::max();
  /// Only storages at file offsets that are multiples of this share a read with others
  /// (an executor that lays a shared read out as in the file keeps their alignment).
  uint64_t share_alignment = 1;
};

/// The plan for the storages with needed[i] (needed.size() == c.storages.size()). Each
/// storage is read once however many tensors view it.
read_plan plan_reads(const checkpoint& c, const std::vector<bool>& needed, const read_plan_options& options = {});

/// Each file's byte source, by file index: what an executor reads read_op::file from.
std::vector<const byte_source*> file_sources(const checkpoint& c);

/// The storages that the tensors at `tensors` (indices into c.tensors: the selected keys)
/// view, their quantizers' scale and zero-point tensors included.
std::vector<bool> storages_of(const checkpoint& c, const std::vector<size_t>& tensors);

}  // namespace ckpt::detail
