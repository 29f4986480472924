// Pieces every verb shares: resource-limit flags, number formatting, terminal checks.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/output_set.h"

namespace cli {

/// Adds --max-pickle-bytes, --max-depth, ... bound to `opts`, and --verify-crc.
void add_reader_flags(CLI::App& cmd, ckpt::open_options& opts);

/// Declares the files a resolved checkpoint path reads as inputs of `set`
/// (ckpt::checkpoint_input_files: the file; a shard set's index and shards; a DCP
/// directory's `.metadata` and data files). Returns the fingerprint of the first (the file,
/// the index or `.metadata`, whose mode outputs copy).
ckpt::file_fingerprint add_checkpoint_inputs(ckpt::output_set& set, const std::string& resolved,
                                             const std::string& hint = {});
/// True when a resolved checkpoint path is a directory: a checkpoint of several files.
bool is_file_set(const std::string& resolved);

/// "1.5 KiB", "12.0 MiB".
std::string human_bytes(uint64_t n);
/// "1,234,567".
std::string with_commas(uint64_t n);
/// "[4, 5]".

/// A verb: its subcommand, and what runs it once the command line is parsed, returning the
/// exit code (ninja's tools do the same). Errors are thrown as ckpt::error and mapped to
/// their exit codes in one place, main.cpp, through ckpt::exit_code.
struct verb {
  CLI::App* command = nullptr;
  std::function<int()> run;
};

/// Flushes standard output; false when anything written to it was lost (a full disk, a
/// closed pipe).
bool flush_stdout();
bool stderr_is_terminal();
bool stdout_is_terminal();

}  // namespace cli
