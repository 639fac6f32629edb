// SnapshotStore: the agent's catalog of what lives in its arena. Chunks are
// indexed by content hash and reference counted; every (rank, version)
// manifest holds one reference per chunk entry, so chunks are shared between
// versions and between the ranks of the node. The bytes themselves are
// written by the ranks, into extents the store reserved for them.
//
// Not thread-safe: owned by the agent's event-loop thread. Which versions to
// keep is decided outside (recovery/'s CommitTracker); the store only
// refuses to release a version that a reader has pinned.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ftrun/status.h"
#include "plugin/common/hash.h"
#include "plugin/store/extent_allocator.h"
#include "plugin/store/manifest.h"

namespace ftrun {

struct StoreStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;      // chunks plus outstanding reservations
  uint64_t reserved_bytes = 0;  // outstanding reservations only
  uint64_t block_bytes = 0;     // blocks outside snapshots (AllocateBlock)
  uint64_t chunks = 0;
  uint64_t versions = 0;
};

class SnapshotStore {
 public:
  // data_offset/data_bytes: the arena's data area. budget_field names where
  // the budget was configured ("configs/x.yaml:4: store.memory_budget"), for
  // errors.
  SnapshotStore(uint64_t data_offset, uint64_t data_bytes, std::string budget_field);

  // Reserves one extent per length for `owner` (a connection). All or
  // nothing: kResourceExhausted names the shortfall and the config field.
  Status Reserve(uint64_t owner, const std::vector<uint64_t>& lengths, std::vector<uint64_t>* offsets);
  // Keeps chunk `hash` (if held) from being freed until the owner's
  // reservations are released: a copy arriving from a peer references it.
  bool HoldChunk(uint64_t owner, const ChunkHash& hash);
  // Frees the owner's reservations that no manifest consumed, and its holds.
  void ReleaseReservations(uint64_t owner);

  // Arena memory for something other than snapshots (an erasure holder's
  // parity rows), counted in the budget like chunks until FreeBlock. `what`
  // names it in the kResourceExhausted error, which names the config field.
  Status AllocateBlock(uint64_t length, const char* what, uint64_t* offset);
  void FreeBlock(uint64_t offset, uint64_t length);

  // Adds a rank's manifest. Chunks with an offset must be extents reserved
  // by `owner` and filled; chunks without one are referenced by hash. The
  // version must be above the rank's last saved one and the layout equal to
  // the rank's first save. All or nothing.
  Status AddManifest(uint64_t owner, Manifest m);

  const Manifest* Find(int rank, uint64_t version) const;
  // Where chunk `hash` lies in the arena, if the store holds it.
  std::optional<uint64_t> ChunkOffset(const ChunkHash& hash) const;
  std::vector<uint64_t> Versions() const;
  std::vector<uint64_t> RankVersions(int rank) const;
  std::vector<int> RanksAt(uint64_t version) const;
  std::optional<uint64_t> LastSaved(int rank) const;

  // Drops every manifest of versions below `version`, except pinned ones
  // (those go when unpinned, if still below the floor).
  void ReleaseBelow(uint64_t version);
  // Drops the unpinned manifests of versions in (low, high): versions that
  // will never be committed (low: the last committed one, kept).
  void ReleaseBetween(std::optional<uint64_t> low, uint64_t high);
  // Drops every manifest of versions above `version` (nullopt: all), e.g.
  // the uncommitted saves of a failed generation; resets each rank's last
  // saved version accordingly, and lowers the release floor to `version`
  // (a job going back to an older version).
  void DiscardAbove(std::optional<uint64_t> version);

  // A chunk whose bytes no longer match its hash (a reader found it). It
  // leaves the index at once, so no later save, copy or restore references
  // those bytes (a good copy of the same hash may be added again), and every
  // manifest that references it leaves the catalog: returned as (rank,
  // version), oldest first. A pinned version's dropped manifests stay alive,
  // unlisted, until it is unpinned (a reader may still use them); the bad
  // extent is freed once nothing references it.
  std::vector<std::pair<int, uint64_t>> DropChunk(const ChunkHash& hash);

  void Pin(uint64_t version);
  void Unpin(uint64_t version);

  StoreStats Stats() const;

 private:
  struct Chunk {
    uint64_t offset;
    uint64_t length;
    uint64_t refs;
  };
  struct Reservation {
    uint64_t offset;
    uint64_t length;
  };

  void ReleaseVersion(uint64_t version);
  void Unref(const ChunkHash& hash);
  // Unref of the chunk a manifest or a hold took at `offset`: a dropped
  // (condemned) chunk there, else the one indexed under `hash`.
  void UnrefAt(const ChunkHash& hash, uint64_t offset);
  void UnrefManifest(const Manifest& m);

  ExtentAllocator alloc_;
  std::string budget_field_;
  uint64_t reserved_bytes_ = 0;
  uint64_t block_bytes_ = 0;
  uint64_t release_floor_ = 0;
  std::unordered_map<ChunkHash, Chunk, ChunkHashHasher> chunks_;
  std::unordered_map<uint64_t, std::vector<Reservation>> reservations_;              // owner ->
  std::unordered_map<uint64_t, std::vector<std::pair<ChunkHash, uint64_t>>> holds_;  // owner -> (hash, offset)
  std::map<uint64_t, std::map<int, Manifest>> versions_;                             // version -> rank ->
  std::unordered_map<uint64_t, Chunk> condemned_;  // offset -> a dropped chunk still referenced
  std::map<uint64_t, std::vector<std::map<int, Manifest>::node_type>> dropped_;  // pinned version -> manifests
  std::map<uint64_t, int> pins_;
  std::map<int, Manifest> layouts_;  // rank -> first manifest (chunks cleared)
};

}  // namespace ftrun
