// The job secret: 32 random bytes the runner generates and hands to every
// agent in a file only the job's user can read (never on a command line).
// Agents prove they know it when they connect (handshake.h).
#pragma once

#include <string>

#include "ftrun/status.h"

namespace ftrun {

inline constexpr size_t kSecretBytes = 32;

// Writes a fresh secret to `path` (mode 0600, created exclusively).
Status WriteNewSecretFile(const std::string& path);
// Reads the secret from `path`. Errors name the file and what was expected:
// a file readable by group or others is refused, as is a wrong length.
Status ReadSecretFile(const std::string& path, std::string* secret);
// Lowercase hex of `n` bytes.
std::string ToHex(const unsigned char* p, size_t n);

}  // namespace ftrun
