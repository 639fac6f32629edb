// Placement: which nodes (slots) keep copies of each slot's shards, and
// which slots form each erasure-coded group.
//
// The slots are laid out on a ring that interleaves failure domains (racks,
// from the hostfile's `rack=` field): r1 r2 r3 r1 r2 r3 ... Each slot's k
// holders are the next k slots on the ring. Every slot therefore holds
// exactly k others (balanced), never itself, and with enough racks its
// holders sit in other racks than it: a rack that fails loses no shard while
// k >= 1 and no rack holds more than ring-distance allows. An erasure group
// is a run of consecutive slots of the same ring, so its members spread over
// as many racks as there are.
#pragma once

#include <string>
#include <vector>

namespace ftrun {

// racks[i]: slot i's failure domain ("" = its own). The slots in ring
// order: racks dealt round-robin, the largest first.
std::vector<int> RackRing(const std::vector<std::string>& racks);

// Returns holders[i], the k slots that keep copies of slot i. Requires
// k < racks.size().
std::vector<std::vector<int>> PlaceReplicas(const std::vector<std::string>& racks, int k);

// The erasure groups of `size` slots each (data + parity nodes): runs of the
// ring. Requires racks.size() to be a multiple of size (ErasureGroupError,
// plugin/config/config.h: the runner checks it at start).
std::vector<std::vector<int>> PlaceErasureGroups(const std::vector<std::string>& racks, int size);

}  // namespace ftrun
