// Replicator internals shared by its source side (replicator.cc) and its
// holder side (replicator_holder.cc): how transfer ids, tokens and store
// reservation owners are told apart.
#pragma once

#include <cstdint>

#include "recovery/cluster_messages.h"

namespace ftrun {
namespace replicator_wire {

constexpr uint64_t kSendTokenBit = 1ull << 63;  // a bulk send's token (receives use their tag)
constexpr uint64_t kPullBit = 1ull << 62;       // a transfer the receiver asked for (a pull)
constexpr uint64_t kOwnerBase = 1ull << 62;     // store reservation owners, above any rank connection id

inline uint16_t T(ClusterMsg m) { return static_cast<uint16_t>(m); }

}  // namespace replicator_wire
}  // namespace ftrun
