// ShardTarget: where a rebuild's decoded bytes land. For one node's shard
// (NodeShard over the manifests being rebuilt) it reserves an extent in the
// store for every chunk the store does not hold yet (once per hash) and
// keeps the ones it holds; the decoder writes shard bytes straight into
// those extents (Extents says where), Check finds the chunks that fail their hash, and Commit
// adds the manifests. Nothing enters the store's index before Commit, and
// Release (or the destructor) gives back what was reserved.
//
// Not thread-safe: driven by the agent's event loop.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "ftrun/status.h"
#include "plugin/erasure/node_shard.h"
#include "plugin/store/snapshot_store.h"

namespace ftrun {

class ShardTarget {
 public:
  // `owner`: the store reservation's; `base`: the store's mapping.
  ShardTarget(SnapshotStore* store, char* base, uint64_t owner) : store_(store), base_(base), owner_(owner) {}
  ~ShardTarget() { Release(); }
  ShardTarget(const ShardTarget&) = delete;
  ShardTarget& operator=(const ShardTarget&) = delete;

  // `shard` outlives this target's use of it (until Commit or Release).
  Status Reserve(const NodeShard* shard);
  // Where shard bytes [at, at + length) go: `put(dest, from, n)` for each
  // part that falls in a reserved extent (bytes [at + from, at + from + n)
  // belong at dest), in order. A decoder writes those parts straight there;
  // the rest (chunks held already, past the shard's end) need no bytes.
  void Extents(uint64_t at, uint64_t length, const std::function<void(uint8_t*, uint64_t, uint64_t)>& put) const;
  // The shard ranges [begin, end) of the written chunks that fail their hash.
  std::vector<std::pair<uint64_t, uint64_t>> Check(std::string* first_bad) const;
  // Each manifest (the ones the shard was made of) into the store with its
  // chunks' extents, except the ranks the store holds at that version.
  Status Commit(std::vector<Manifest>* manifests);
  void Release();

 private:
  SnapshotStore* store_;
  char* base_;
  uint64_t owner_;
  const NodeShard* shard_ = nullptr;
  // Per chunk of shard_: its reserved extent; kNoOffset for one the store
  // holds already or a repeat of an earlier one (referenced by hash).
  std::vector<uint64_t> target_;
  bool reserved_ = false;
};

}  // namespace ftrun
