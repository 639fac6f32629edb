// Parsing and printing of byte sizes and durations as written in config
// files and on the command line.
//
// All functions are pure and thread-safe. Parse errors come back as
// InvalidArgument whose message says what was expected and quotes the input,
// so a caller only has to prefix where the text came from.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "ftrun/status.h"

namespace ftrun {

// Parses a byte size: a non-negative decimal number, optional spaces, then a
// case-sensitive unit:
//   (none), B                  bytes (must be a whole number)
//   KiB MiB GiB TiB, K M G T   powers of 1024
//   KB MB GB TB                powers of 1000
// e.g. "4GiB", "512MiB", "4GB" (= 4e9), "4096", "1.5GiB". Up to 6 decimal
// places; a fractional result is rounded down to whole bytes. Leading and
// trailing spaces are ignored. Empty, negative, junk or > 2^64-1 bytes ->
// InvalidArgument. *out is written only on success.
Status ParseSize(const std::string& text, uint64_t* out);

// Parses a duration: a non-negative decimal number, optional spaces, then a
// unit, which is required: ms, s, m (minutes), h. e.g. "30s", "500ms", "2m",
// "1.5s", "0s". The value must be a whole number of milliseconds. *out is
// written only on success.
Status ParseDuration(const std::string& text, std::chrono::milliseconds* out);

// Human-readable size in powers of 1024: "512 B", "3.2 MiB", "4.0 GiB",
// "512 MiB". Values below 100 of their unit get one decimal place, larger
// ones none. ParseSize accepts the result (up to the rounding).
std::string FormatSize(uint64_t bytes);

}  // namespace ftrun
