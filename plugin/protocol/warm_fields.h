// The payload of the warm control frames (plugin/ipc/wire.h kWarm*): lines of
// key=value, written by the agent and by ftrun/warm.py. Keys are
// letters, digits, '_' and '.'; values any bytes but a newline. Decode
// refuses anything else, a repeated key, or more than kMaxFields lines: the
// other side may be hostile.
#pragma once

#include <map>
#include <string>

#include "ftrun/status.h"

namespace ftrun {

using WarmFields = std::map<std::string, std::string>;

inline constexpr size_t kMaxWarmFields = 256;

std::string EncodeWarmFields(const WarmFields& fields);
Status DecodeWarmFields(const std::string& payload, WarmFields* out);

// fields[key] as an int in [lo, hi]; InvalidArgument naming the key otherwise.
Status WarmInt(const WarmFields& fields, const std::string& key, long long lo, long long hi, long long* out);

}  // namespace ftrun
