// ErasureRebuild: a replacement (or a restarted agent) rebuilds its node's
// ranks of the committed version from the survivors of its erasure group,
// when no copy of them is left (the coordinator's kPull names the group and
// what each member still has).
//
// First the node's manifests (its layout and every chunk's hash), from any
// survivor its members sent them to. Then, slice by slice (two at a time), `data` fragments
// of the slice's stripe from as many survivors in parallel (their data
// slices, or their parity rows), decoded with ReedSolomon into the slice.
// Once every slice is decoded, every chunk is checked against its hash; a
// slice with a chunk that fails is decoded again from another choice of
// fragments (a survivor whose fragment was bad is thereby left out), until
// the choices run out. Only then do the chunks enter the store, each rank's
// manifest with them, and the rebuild is done: the ranks may start.
//
// Not thread-safe: driven by the agent's event loop.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "plugin/erasure/group_code.h"
#include "plugin/erasure/node_shard.h"
#include "plugin/erasure/parity_messages.h"
#include "plugin/store/snapshot_store.h"
#include "plugin/transport/transport.h"

namespace ftrun {

class ErasureRebuild {
 public:
  // `code` outlives it; `arena_base` is the store's mapping; `connect`
  // reaches a survivor before it is asked.
  ErasureRebuild(Transport* transport, SnapshotStore* store, char* arena_base, const GroupCode* code,
                 std::function<void(PeerId)> connect);

  // Rebuilds `ranks` (this node's, in order) at `version`; `group` and
  // `self` as the pull names them. A rebuild under way is abandoned.
  void Begin(uint64_t epoch, uint64_t version, std::vector<int> ranks, std::vector<ErasureSource> group, int self);
  void Cancel();

  bool Handle(PeerId from, uint16_t type, const std::string& payload);
  bool BulkDone(uint64_t token, const Status& status);
  void PeerDown(PeerId peer);

  // Every rank is in the store, every chunk checked.
  std::function<void(uint64_t epoch, uint64_t version, const std::vector<int>& ranks)> on_done;
  // It cannot be done (no survivor has the manifests, too few fragments,
  // every choice decodes a chunk that fails its hash).
  std::function<void(uint64_t epoch, uint64_t version, int rank, const Status&)> on_failed;

  struct Stats {
    uint64_t fragment_bytes = 0;  // received (this rebuild's)
    int redecoded = 0;            // slices decoded again after a chunk failed its hash
  };
  const Stats& stats() const { return stats_; }

 private:
  struct Slice {
    int stripe = 0, fragment = 0;                             // where this node's slice is coded
    std::set<int> excluded;                                   // fragments that failed to arrive
    std::set<std::vector<int>> tried;                         // choices decoded already
    std::vector<int> chosen;                                  // the choice being fetched
    std::vector<std::shared_ptr<std::vector<uint8_t>>> bufs;  // its fragments, as they land
    int outstanding = 0;
  };
  void AskManifests();
  void Plan();
  void Fetch(size_t t);
  // Fragment `fragment` of slice t's stripe did not come: another choice.
  void Lost(size_t t, int fragment);
  void AbandonAsks(size_t t);
  void Decode(size_t t);
  void Verify();
  void Store();
  void Fail(const Status& why);
  PeerId Source(int member) const { return group_[static_cast<size_t>(member)].agent; }

  Transport* t_;
  SnapshotStore* store_;
  char* base_;
  const GroupCode* code_;
  std::function<void(PeerId)> connect_;
  bool active_ = false;
  uint64_t epoch_ = 0, version_ = 0;
  std::vector<int> ranks_;
  std::vector<ErasureSource> group_;
  int self_ = -1;
  std::vector<int> manifest_sources_;  // members still to ask for the manifests
  std::vector<Manifest> manifests_;
  std::unique_ptr<NodeShard> shard_;
  uint64_t slice_len_ = 0;
  std::vector<uint8_t> bytes_;  // the node's shard, decoded
  std::vector<Slice> slices_;
  // Slices to fetch and decode, in turn, kSlicesInFlight at a time (a
  // survivor stages the next while the last crosses and is decoded).
  static constexpr int kSlicesInFlight = 2;
  std::vector<size_t> pending_;
  int in_flight_ = 0;
  void FetchMore();
  uint64_t next_id_ = 1;
  struct Ask {
    size_t slice = 0;
    PeerId peer = 0;
    std::shared_ptr<std::vector<uint8_t>> buf;  // a fragment's: where its bytes land
    bool manifests = false;
    bool dead = false;    // abandoned: forgotten once its receive ends (or at once, not posted)
    bool posted = false;  // its receive is posted (kFragmentReady came)
    int fragment = -1;
  };
  std::map<uint64_t, Ask> asks_;  // xfer (= tag = receive token) -> what it is for
  Stats stats_;
};

}  // namespace ftrun
