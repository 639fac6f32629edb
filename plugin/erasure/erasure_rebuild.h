// ErasureRebuild: a replacement (or a restarted agent) rebuilds its node's
// ranks of the committed version from the survivors of its erasure group,
// when no copy of them is left (the coordinator's kPull names the group and
// what each member still has).
//
// First the node's manifests (its layout and every chunk's hash), from any
// survivor its members sent them to; the store extents of the chunks it
// does not hold yet are reserved then (ShardTarget). Then piece by piece (a
// piece: up to kPieceBytes of one of the node's slices; kPiecesInFlight at
// a time, so each survivor stages the next piece while the last crosses and
// is decoded), `data` fragments of the piece's stripe from as many
// survivors in parallel (their data slices, or their parity rows; the
// choice rotates from piece to piece so every survivor serves about as
// much), decoded with ReedSolomon straight into those extents. A piece
// whose chunks the store holds already is not fetched (a restarted agent
// fetches what changed). The fragment buffers are reused: at most
// kPiecesInFlight x data x kPieceBytes in flight.
//
// Once every piece is decoded, every chunk written is checked against its
// hash; the pieces under a chunk that fails are decoded again from another
// choice of fragments (a survivor whose fragment was bad is thereby left
// out), until the choices run out. Only then does each rank's manifest
// enter the store, and the rebuild is done: the ranks may start.
//
// Nothing waits forever: an ask unanswered for kAskTimeout (a survivor that
// stalls, or staged the bytes and dropped them) is abandoned like a refused
// one. A fragment refused or abandoned is asked for again; a survivor that
// failed kMisses asks in all is left out, and its fragments are decoded
// around; when the choices run out the rebuild fails (on_failed), and the
// coordinator falls back to the disk or stops, naming why.
//
// Not thread-safe: driven by the agent's event loop.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "plugin/erasure/byte_pool.h"
#include "plugin/erasure/group_code.h"
#include "plugin/erasure/node_shard.h"
#include "plugin/erasure/shard_target.h"
#include "plugin/protocol/parity_messages.h"
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
  // Asks older than kAskTimeout (counted from the first Tick that saw them) are abandoned.
  void Tick(std::chrono::steady_clock::time_point now);

  static constexpr auto kAskTimeout = std::chrono::seconds(10);
  static constexpr int kMisses = 3;

  // Bytes of each fragment fetched at once (tests make it small).
  static constexpr uint64_t kPieceBytes = FragmentRequestMsg::kMaxLength;
  void set_piece_bytes(uint64_t n) { piece_ = std::min(n, kPieceBytes); }

  // Every rank is in the store, every chunk checked.
  std::function<void(uint64_t epoch, uint64_t version, const std::vector<int>& ranks)> on_done;
  // It cannot be done (no survivor has the manifests, too few fragments,
  // every choice decodes a chunk that fails its hash).
  std::function<void(uint64_t epoch, uint64_t version, int rank, const Status&)> on_failed;

  struct Stats {
    uint64_t fragment_bytes = 0;  // received (this rebuild's)
    int redecoded = 0;            // pieces decoded again after a chunk failed its hash
  };
  const Stats& stats() const { return stats_; }

 private:
  using Buffer = std::shared_ptr<std::vector<uint8_t>>;
  // Bytes [offset, offset + length) of this node's slice `slice`: where
  // they are coded (stripe, fragment) and how they are being fetched.
  struct Piece {
    int slice = 0, stripe = 0, fragment = 0;
    uint64_t offset = 0, length = 0;
    std::set<std::vector<int>> tried;  // choices decoded already
    std::vector<int> chosen;           // the choice being fetched
    std::vector<Buffer> bufs;          // its fragments, as they land
    int outstanding = 0;
  };
  void AskManifests();
  void Plan();
  void Fetch(size_t u);
  void FetchMore();
  // A fragment of piece u did not come from `peer`: asked for again, or
  // (the peer's kMisses-th miss) decoded around.
  void Lost(size_t u, PeerId peer);
  // `peer` serves nothing more to this rebuild.
  void LeaveOut(PeerId peer);
  void AbandonAsks(size_t u);
  void Decode(size_t u);
  void Verify();
  void Store();
  void Fail(const Status& why);
  PeerId Source(int member) const { return group_[static_cast<size_t>(member)].agent; }

  Transport* t_;
  ShardTarget target_;
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
  uint64_t piece_ = kPieceBytes;
  std::vector<Piece> pieces_;
  static constexpr int kPiecesInFlight = 4;
  std::vector<size_t> pending_;  // pieces to fetch, in turn
  int in_flight_ = 0;
  BytePool pool_{32 * kPiecesInFlight};  // fragment buffers to reuse (as many as can be in flight: data <= 32)
  uint64_t next_id_ = 1;
  struct Ask {
    size_t piece = 0;
    PeerId peer = 0;
    Buffer buf;  // a fragment's: where its bytes land
    bool manifests = false;
    bool dead = false;    // abandoned: forgotten once its receive ends (or at once, not posted)
    bool posted = false;  // its receive is posted (kFragmentReady came)
    int fragment = -1;
    std::optional<std::chrono::steady_clock::time_point> seen;  // by the first Tick after it was sent
  };
  std::map<uint64_t, Ask> asks_;  // xfer (= tag = receive token) -> what it is for
  std::map<PeerId, int> misses_;  // survivor -> asks it failed (refused, lost, too late)
  Stats stats_;
};

}  // namespace ftrun
