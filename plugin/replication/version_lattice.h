// Which saved version a busy source copies next, so that every node of a job
// ends up copying the same versions without asking anyone.
//
// A source starts copying a rank's version as soon as the rank saves it. When
// a holder's link is busy, saves that arrive meanwhile wait in a queue of one
// per rank, and a newer save takes the queued one's place only if its level
// (the number of trailing zero bits of the version) is at least as high.
// So a queue keeps the highest-level version saved while the link was busy,
// the newest of those on a tie.
//
// Why the nodes agree: if no node's link stays busy for 2^m consecutive
// versions, any window of saves that a busy link spans holds at most one
// multiple of 2^m, and that one outranks every other version of the window.
// Every node therefore copies every multiple of 2^m (those saved while its
// link was idle it copies at once), so the coordinator finds a version that
// every rank's holders hold at least every 2^m versions, whatever the speed
// of each node's links, with no round trip before a copy starts. A job whose
// versions have no such structure (every version odd) still commits: the
// coordinator then names a version for every node to copy (its fallback
// round, see Coordinator::MaybeTarget).
#pragma once

#include <cstdint>

namespace ftrun {

// The version's level: trailing zero bits (version 0 outranks every other).
inline int VersionLevel(uint64_t version) { return version == 0 ? 64 : __builtin_ctzll(version); }

// A newer save `newer` takes the place of a queued `queued` (same rank).
inline bool ReplacesQueued(uint64_t newer, uint64_t queued) {
  return newer > queued && VersionLevel(newer) >= VersionLevel(queued);
}

}  // namespace ftrun
