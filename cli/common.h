// Pieces every verb shares: resource-limit flags, number formatting, terminal checks.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "ckpt/checkpoint.h"

namespace cli {

/// Adds --max-pickle-bytes, --max-depth, ... bound to `opts`, and --verify-crc.
void add_reader_flags(CLI::App& cmd, ckpt::open_options& opts);

/// "1.5 KiB", "12.0 MiB".
std::string human_bytes(uint64_t n);
/// "1,234,567".
std::string with_commas(uint64_t n);
/// "[4, 5]".

/// The exit status a verb's callback chose (CLI11 callbacks cannot return one).
int last_exit_code();
void set_exit_code(int code);

/// Flushes standard output; false when anything written to it was lost (a full disk, a
/// closed pipe).
bool flush_stdout();
bool stderr_is_terminal();

}  // namespace cli
