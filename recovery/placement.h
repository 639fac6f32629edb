// Placement: which nodes (slots) keep copies of each slot's shards.
//
// The slots are laid out on a ring that interleaves failure domains (racks,
// from the hostfile's `rack=` field): r1 r2 r3 r1 r2 r3 ... Each slot's k
// holders are the next k slots on the ring. Every slot therefore holds
// exactly k others (balanced), never itself, and with enough racks its
// holders sit in other racks than it: a rack that fails loses no shard while
// k >= 1 and no rack holds more than ring-distance allows.
#pragma once

#include <string>
#include <vector>

namespace ftrun {

// racks[i]: slot i's failure domain ("" = its own). Returns holders[i], the
// k slots that keep copies of slot i. Requires k < racks.size().
std::vector<std::vector<int>> PlaceReplicas(const std::vector<std::string>& racks, int k);

}  // namespace ftrun
