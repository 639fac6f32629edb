// NodeShard: what erasure coding protects of one node, at one version: its
// ranks' manifests' chunks, in order (rank, tensor, chunk), as one byte
// string (the node's shard). The member cuts it into `data` slices of
// SliceLength() bytes each (its own: a group's shards may differ in length;
// a stripe's shorter fragments read as zeros past their end, which is what
// a linear code needs), and each slice is its data fragment in one stripe
// (GroupCode::Locate).
//
// PlanDeltas says what a new version changes: the chunks whose hash differs
// from the base version's at the same place, cut at slice boundaries into
// pieces, each with the stripe, fragment and offset its parity holders
// update. A version that changed 10% of the chunks plans 10% of the bytes.
//
// Plain data over the store's manifests (which must outlive it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ftrun/status.h"
#include "plugin/erasure/group_code.h"
#include "plugin/store/manifest.h"

namespace ftrun {

class NodeShard {
 public:
  struct Chunk {
    uint64_t at = 0;                // offset in the shard
    const ChunkRef* ref = nullptr;  // in its manifest
  };

  // `ranks`: this node's manifests of one version, in rank order.
  explicit NodeShard(const std::vector<const Manifest*>& ranks);

  uint64_t size() const { return size_; }
  const std::vector<Chunk>& chunks() const { return chunks_; }
  // The same chunk lengths at the same offsets (a rank's layout never
  // changes between saves, so two versions of one node compare equal).
  bool SameLayout(const NodeShard& o) const;
  // This member's slice length in a group coding `data` slices per shard.
  uint64_t SliceLength(int data) const;

 private:
  uint64_t size_ = 0;
  std::vector<Chunk> chunks_;
};

// One piece of a changed chunk, within one slice.
struct DeltaPiece {
  size_t chunk = 0;           // index in NodeShard::chunks()
  uint64_t chunk_offset = 0;  // where in that chunk the piece starts
  uint64_t length = 0;
  GroupCode::Place place;  // its stripe, fragment and offset in the slice
};

// The pieces of `now` that changed since `base`, by stripe: [s] for stripe
// s, ascending offsets. base == nullptr: every chunk (a first version, or a
// holder with no parity to update). InvalidArgument when base's layout is
// not now's (a delta between them means nothing).
Status PlanDeltas(const GroupCode& code, int member, const NodeShard& now, const NodeShard* base,
                  std::vector<std::vector<DeltaPiece>>* by_stripe);

}  // namespace ftrun
