// Replicator: copies (rank, version) snapshots between agents' stores.
//
// Source side: after a rank's save, the manifest is offered to each holder
// of this node's shards. The holder answers with the chunks it lacks (its
// store deduplicates by content hash, so an incremental save sends only the
// changed chunks), having reserved arena extents for them and posted
// receives straight into them; the source then sends those chunks from its
// own arena, at most kWindowBytes in flight per holder. The version stays
// pinned in the source store until the holder says it is stored. One
// transfer per holder at a time; a queued (not started) older version of a
// rank is dropped when a newer one is queued, so a slow holder never makes
// the queue or the memory grow, and a rank's save never waits.
//
// Holder side: verifies every received chunk's hash before the manifest
// enters its store. Pulls (a spare rebuilding a lost node) are the same
// transfer, started by the puller's request. The source checks each chunk's
// hash too before it sends it: a chunk corrupted in its shared memory is
// never sent; the transfer fails (the peer is told, a puller tries its next
// holder) and on_corrupt reports the chunk.
//
// Not thread-safe: driven by the agent's event loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "plugin/common/clock.h"
#include "plugin/replication/peer_roles.h"
#include "plugin/store/snapshot_store.h"
#include "plugin/transport/transport.h"

namespace ftrun {

class Replicator {
 public:
  // Chunks in flight to one holder. Small enough that chunks complete one
  // after another, so the holder verifies each while the next is on the
  // wire (with the whole state in flight UCX interleaves them and every
  // chunk lands at the end, leaving all the hashing to do after it);
  // large enough to keep the link busy.
  static constexpr uint64_t kWindowBytes = 32ull << 20;

  // `clock`: where progress times are read (a ManualClock in tests).
  Replicator(Transport* transport, SnapshotStore* store, char* arena_base, uint64_t chunk_size,
             const Clock& clock = Clock::Steady());

  // Transfers of older epochs stop (their reservations go once their
  // receives end); offers from older epochs are refused.
  void SetEpoch(uint64_t epoch);
  void SetHolders(std::vector<PeerId> holders);
  // Who may copy into, or pull from, this store (the latest membership).
  // Pull requests that waited for a membership naming their puller are
  // served or refused now.
  void SetRoles(PeerRoles roles);
  // A copy (either side, routine or pull) that makes no progress (no chunk
  // completes, no answer comes) for this long is cancelled: see Tick.
  void SetCopyTimeout(std::chrono::milliseconds timeout) { copy_timeout_ = timeout; }
  const std::vector<PeerId>& holders() const { return holders_; }

  // A local rank's manifest is in the store: copy it to every holder.
  void Saved(int rank, uint64_t version);
  // Asks `from` to send us (rank, version); returns the pull's id.
  uint64_t Pull(PeerId from, int rank, uint64_t version);

  // Replication messages; false for a type it does not own.
  bool Handle(PeerId from, uint16_t type, const std::string& payload);
  // Transport completions and failures.
  bool BulkDone(uint64_t token, const Status& status);
  void PeerDown(PeerId peer);
  // Cancels the copies that made no progress for the copy timeout, with a
  // WARN each: a source tells the holder (kAbort) and fails the copy
  // (on_copy_failed: the coordinator's round moves on, and the next version
  // goes to that holder with every chunk it lacks); a holder cancels its
  // receives and refuses the copy. Then on_stalled(peer): a UCX request on
  // that connection may never end (a rendezvous whose other side is gone
  // or wedged), so the owner resets the connection, which fails what is
  // left of it on both sides.
  void Tick(std::chrono::steady_clock::time_point now);

  // Holder side: a copy of (rank, version) is complete in our store.
  std::function<void(int rank, uint64_t version)> on_stored;
  // Source side: a routine copy failed for another reason than an epoch
  // change (the holder refused it, or the version is gone).
  std::function<void(int rank, uint64_t version, const Status&)> on_copy_failed;
  // Source side: a chunk of (rank, version) is corrupted in our shared
  // memory: found before a pull sent it (not sent), or after a holder
  // refused a routine copy that carried it (not kept there).
  std::function<void(int rank, uint64_t version, const ChunkRef& chunk)> on_corrupt;
  // Puller side: a pull ended (OK: stored).
  std::function<void(uint64_t pull, PeerId from, int rank, uint64_t version, const Status&)> on_pulled;
  // A copy with `peer` stalled and was cancelled (Tick).
  std::function<void(PeerId peer)> on_stalled;

  // The last completed copies sent from here (for status and benchmarks).
  struct Record {
    PeerId to;
    int rank;
    uint64_t version;
    uint64_t state_bytes;  // the manifest's
    uint64_t bytes_sent;   // chunks the holder lacked
    double seconds;        // offer to stored
  };
  const std::deque<Record>& history() const { return history_; }

 private:
  struct Job {
    int rank;
    uint64_t version;
    uint64_t epoch;
    uint64_t xfer;  // the puller's id for pulls, else assigned at start
  };
  struct Out {  // one active transfer to a peer
    Job job;
    PeerId to;
    std::vector<ChunkRef> chunks;                  // the store's manifest's, in order
    std::deque<std::pair<size_t, uint64_t>> todo;  // (chunk index, tag) still to send
    std::vector<size_t> sent;                      // chunk indices handed to the transport (unchecked)
    uint64_t inflight_bytes = 0;
    int inflight = 0;
    uint64_t state_bytes = 0;
    uint64_t bytes_sent = 0;
    std::chrono::steady_clock::time_point started;
    std::chrono::steady_clock::time_point progress;  // started, the want list, a chunk sent
  };
  struct In {  // one transfer into our store
    PeerId from;
    uint64_t xfer;
    uint64_t epoch;
    Manifest manifest;
    uint64_t owner;                // reservation owner in the store
    std::vector<uint64_t> tokens;  // posted receives
    int outstanding = 0;
    Status error;
    std::chrono::steady_clock::time_point progress;  // the offer, a chunk landed
    bool stalled = false;                            // cancelled by Tick
  };

  void Enqueue(PeerId to, Job job);
  void StartNext(PeerId to);
  void Pump(Out& out);
  // A chunk of out's failed its check: the transfer ends (out is gone).
  void SourceCorrupt(Out& out, ChunkRef chunk, const char* what);
  // The holder refused a routine copy: a chunk we sent without checking it
  // may be corrupted here (then SourceCorrupt, and true).
  bool SentCorrupt(Out& out);
  void FinishOut(PeerId to, const Status& s);
  void Offer(PeerId from, ByteReader* r);
  void Want(PeerId from, ByteReader* r);
  void Stored(PeerId from, ByteReader* r);
  void OfferFailed(PeerId from, ByteReader* r);
  void Aborted(PeerId from, ByteReader* r);
  void PullRequest(PeerId from, ByteReader* r);
  struct DeferredPull {
    PeerId from;
    uint64_t xfer;
    uint64_t epoch;
    int rank;
    uint64_t version;
    std::chrono::steady_clock::time_point since;
  };
  void ServePull(const DeferredPull& p);
  void RefusePull(const DeferredPull& p, const Status& why);
  void ExpireDeferredPulls(std::chrono::steady_clock::time_point now);
  void FinishIn(std::pair<PeerId, uint64_t> key);
  void PullDone(uint64_t xfer, PeerId from, const Status& s);
  void Reply(PeerId to, uint16_t type, uint64_t xfer, const std::string& message = {});

  Transport* t_;
  const Clock& clock_;
  SnapshotStore* store_;
  char* base_;
  uint64_t chunk_size_;
  uint64_t epoch_ = 0;
  std::chrono::milliseconds copy_timeout_{5000};
  std::vector<PeerId> holders_;
  PeerRoles roles_;
  // Pull requests from a peer that a membership newer than ours may name
  // (bounded; refused after a copy timeout).
  static constexpr size_t kMaxDeferredPulls = 64;
  std::deque<DeferredPull> deferred_;
  uint64_t next_xfer_ = 1;
  uint64_t next_tag_ = 1;
  uint64_t next_owner_ = 1;
  std::map<PeerId, std::deque<Job>> queue_;
  std::map<PeerId, Out> out_;                                    // active, one per peer
  std::map<uint64_t, std::pair<PeerId, uint64_t>> send_tokens_;  // send token -> (peer, length)
  std::map<std::pair<PeerId, uint64_t>, In> in_;                 // (from, xfer) ->
  struct RecvToken {
    std::pair<PeerId, uint64_t> key;  // in_'s
    ChunkRef* chunk;                  // in that transfer's manifest
  };
  std::map<uint64_t, RecvToken> recv_tokens_;
  struct PendingPull {
    int rank;
    uint64_t version;
    PeerId from;
    uint64_t epoch;  // ours when asked: an offer for it after the epoch moved on is refused
  };
  std::map<uint64_t, PendingPull> pulls_;  // pull xfer ->
  std::deque<Record> history_;
};

}  // namespace ftrun
