// Parse-time checks of option values, so a bad value is a one-line usage error (exit 2)
// before any file is opened, rather than a surprise later (a limit of -1 read as 2^64-1,
// `--device mps` failing as a device error, `-o ''`).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

namespace cli {

/// A decimal count from 0 to `max` (no sign, no exponent).
CLI::Validator limit_value(uint64_t max);
/// --threads: 1 to 256 (leaving the flag out keeps the default).
CLI::Validator thread_count();
/// --device: cpu, meta, cuda or cuda:N.
CLI::Validator device_name();
/// --dtype: a floating dtype name (the valid ones are listed when it is not).
CLI::Validator floating_dtype();
/// --atol, --rtol: a finite number >= 0 (torch refuses NaN and negative tolerances).
CLI::Validator tolerance();
/// A decimal integer from `min` to `max` (no sign, no exponent).
CLI::Validator integer_in(int64_t min, int64_t max);
/// A path that is not the empty string.
CLI::Validator non_empty_path();

}  // namespace cli
