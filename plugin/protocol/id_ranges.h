// Where every id that crosses an agent's connections, or owns a reservation
// in its store, comes from: the parts that share them (replication,
// erasure coding, the disk restorer, the ranks' connections) each take
// their ids from a range of their own, so that a message, a bulk
// transfer's tag or token, or a reservation can never be taken for
// another part's. The ranges are the high bits of a uint64; each part
// counts upward from its base, and none reaches the next base's bit.
//
//   bit 63    Replicator: bulk send tokens (receives use their tag)
//   bit 62    Replicator: transfers a receiver asked for (pulls), and the
//             holders' store reservation owners
//   bit 61    ParityExchange: xfers, tags, tokens; +1: ErasureRebuild's
//             store reservation owner
//   bit 60    FragmentServer: bulk send tokens
//   bit 59    ErasureRebuild: xfers (= tags = tokens)
//   below 59  Replicator offers' transfer ids; ranks' connection ids
//             (store reservation owners)
//   ~0 - 7    DiskRestorer: its store reservation owner
#pragma once

#include <cstdint>

namespace ftrun {
namespace id_ranges {

inline constexpr uint64_t kReplicaSendToken = 1ull << 63;
inline constexpr uint64_t kReplicaPull = 1ull << 62;
inline constexpr uint64_t kReplicaOwnerBase = 1ull << 62;
inline constexpr uint64_t kParity = 1ull << 61;
inline constexpr uint64_t kRebuildOwner = kParity + 1;
inline constexpr uint64_t kFragmentToken = 1ull << 60;
inline constexpr uint64_t kRebuild = 1ull << 59;
inline constexpr uint64_t kDiskRestoreOwner = ~0ull - 7;

}  // namespace id_ranges
}  // namespace ftrun
