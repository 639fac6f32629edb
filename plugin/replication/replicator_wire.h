// Replicator internals shared by its source side (replicator.cc) and its
// holder side (replicator_holder.cc): how transfer ids, tokens and store
// reservation owners are told apart.
#pragma once

#include <cstdint>

#include "plugin/protocol/cluster_messages.h"
#include "plugin/protocol/id_ranges.h"

namespace ftrun {
namespace replicator_wire {

constexpr uint64_t kSendTokenBit = id_ranges::kReplicaSendToken;  // a bulk send's token (receives use their tag)
constexpr uint64_t kPullBit = id_ranges::kReplicaPull;            // a transfer the receiver asked for (a pull)
constexpr uint64_t kOwnerBase = id_ranges::kReplicaOwnerBase;     // store reservation owners

inline uint16_t T(ClusterMsg m) { return static_cast<uint16_t>(m); }

}  // namespace replicator_wire
}  // namespace ftrun
