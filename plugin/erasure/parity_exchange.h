// ParityExchange: keeps an erasure-coded group's parity up to date, over
// the transport, as the members' ranks save new versions.
//
// Contributor side (Contribute): for a commit round's version, this node's
// shard (node_shard.h) is compared with the base version's chunk by chunk;
// each changed chunk's delta (old XOR new: both versions are pinned in this
// node's store, every chunk's hash checked before it is read) goes to the
// holders of the parity rows of the stripe its slice belongs to, in offers
// of at most kOfferBytes, each one bulk transfer. A stripe with no change
// still gets a last, empty offer: its holders learn this fragment is at the
// new version. The delta bytes of one offer are computed once and sent to
// every holder of the stripe. A holder with no parity of the base (a
// replacement's) asks for the whole fragment instead (need_full), the delta
// from zeros. The last offer of a (stripe, row) goes only after the others
// were applied, so "last" means every delta is in.
//
// Holder side: checks that an offer comes from the agent whose fragment it
// names, for a row this member holds, in this epoch, then receives the
// deltas and applies them (ParityRows). A sender has at most kInflight
// offers in flight per row this member holds; one more is refused before
// its bytes are allocated, so what the group can make a holder allocate is
// bounded by members x parity x kInflight x kOfferBytes. A version whose rows all got every
// contributor's last offer is complete (on_complete): the commit needs it.
//
// What crosses the wire and what the CPUs do follows the change: a version
// that changed 10% of the chunks sends 10% of the shard to each of `parity`
// holders, as `parity` replicas would, for parity/data of the memory.
//
// Not thread-safe: driven by the agent's event loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "plugin/common/clock.h"
#include "plugin/erasure/group_code.h"
#include "plugin/erasure/node_shard.h"
#include "plugin/erasure/parity_rows.h"
#include "plugin/protocol/parity_messages.h"
#include "plugin/store/snapshot_store.h"
#include "plugin/transport/transport.h"

namespace ftrun {

class ParityExchange {
 public:
  // One offer's deltas at most; the offers in flight to one holder at most.
  static constexpr uint64_t kOfferBytes = ParityOfferMsg::kMaxBytes;
  static constexpr int kInflight = 2;

  // `code` and `store` outlive the exchange; `arena_base` is the store's
  // mapping (the parity rows' blocks are the store's too); `clock` times
  // contributions (the agent's).
  ParityExchange(Transport* transport, SnapshotStore* store, char* arena_base, const GroupCode* code,
                 const Clock& clock = Clock::Steady());

  // This node's group: members[i] is member i's agent; this node is `self`.
  // Contributions under way to an agent no longer in the group fail.
  void SetGroup(std::vector<PeerId> members, int self);
  // Contributions and offers of older epochs stop.
  void SetEpoch(uint64_t epoch);

  // Sends this node's deltas of `ranks` at `version` since `base` (nullopt:
  // since zeros) to the holders of its stripes' parity. The manifests must
  // be in the store (FailedPrecondition otherwise); the versions stay
  // pinned until the contribution ends (on_contributed or on_failed).
  Status Contribute(uint64_t version, std::optional<uint64_t> base, const std::vector<int>& ranks);

  bool Handle(PeerId from, uint16_t type, const std::string& payload);
  bool BulkDone(uint64_t token, const Status& status);
  void PeerDown(PeerId peer);

  // The job committed `version`: older parity and manifests go. Or went
  // back to `version` (nullopt: nothing): what lies above it goes.
  void Committed(uint64_t version);
  void DiscardAbove(std::optional<uint64_t> version);
  // Epoch `epoch` starts from `version` (nullopt: from nothing): the parity
  // and manifests above it are an older timeline's (ParityRows::StartsFrom).
  void StartsFrom(uint64_t epoch, std::optional<uint64_t> version);
  // Member `member`'s manifests of `version` as it sent them with its
  // deltas (nullptr: none here).
  const std::vector<Manifest>* Manifests(uint64_t version, int member) const;
  const GroupCode& code() const { return *code_; }
  const std::vector<PeerId>& members() const { return members_; }
  int self() const { return self_; }
  uint64_t epoch() const { return epoch_; }
  // The member `peer` is in this node's group, or -1.
  int MemberOf(PeerId peer) const;

  // The parity this member holds (SetGroup first: a new place in the group
  // starts with none).
  ParityRows& rows() { return *rows_; }
  const ParityRows& rows() const { return *rows_; }

  // Contributor: every holder applied every delta of `version`.
  std::function<void(uint64_t version)> on_contributed;
  // Contributor: a holder refused or was lost, or a chunk failed its hash.
  std::function<void(uint64_t version, const Status&)> on_failed;
  // Holder: every row this member holds is complete at `version`.
  std::function<void(uint64_t version)> on_complete;

  struct Stats {
    uint64_t delta_bytes_sent = 0;  // offered bytes whose send completed
    uint64_t full_restarts = 0;     // holders that asked for a whole fragment
  };
  const Stats& stats() const { return stats_; }

  // The last contributions that ended well (for status and benchmarks).
  struct Record {
    uint64_t version = 0;
    bool from_zeros = false;     // no base: every fragment whole
    uint64_t shard_bytes = 0;    // this node's shard
    uint64_t changed_bytes = 0;  // of the shard, since the base
    uint64_t bytes_sent = 0;     // deltas, to all holders
    int full_holders = 0;        // holders that asked for whole fragments (new to their rows)
    double seconds = 0;          // Contribute to the last holder's answer
  };
  const std::deque<Record>& history() const { return history_; }

 private:
  // Contributor side (parity_exchange.cc).
  struct Part {
    size_t piece;
    uint64_t offset;  // in the piece
    uint64_t length;
  };
  using Batch = std::vector<Part>;
  struct Plan {         // one stripe's pieces, cut into offers
    bool full = false;  // the fragment whole (the delta from zeros)
    std::vector<DeltaPiece> pieces;
    std::vector<Batch> batches;
    std::vector<std::weak_ptr<std::vector<uint8_t>>> bytes;  // computed once per batch while in flight
  };
  struct Job {  // one (stripe, row) this node contributes to
    PeerId to;
    int stripe, row, fragment;
    bool full = false;
    size_t next = 0;
    int inflight = 0;
    bool finished = false;
  };
  struct Contribution {
    uint64_t epoch;
    std::optional<uint64_t> base;
    std::vector<uint64_t> pinned;
    std::unique_ptr<NodeShard> now, before;
    std::map<std::pair<int, bool>, Plan> plans;  // (stripe, full) ->
    std::vector<Job> jobs;
    std::vector<uint8_t> checked;  // per chunk: its hashes verified (BatchBytes)
    uint64_t bytes_sent = 0;
    Clock::Time started;
    int unfinished = 0;
  };
  struct Sent {
    uint64_t version = 0;
    size_t job = 0;
    bool last = false;
    bool full = false;  // whole fragments (after the holder's need_full)
    std::shared_ptr<std::vector<uint8_t>> bytes;
    uint64_t token = 0;
  };
  Status Prepare(uint64_t version, Contribution* c, const std::vector<int>& ranks);
  Plan* PlanFor(Contribution& c, int stripe, bool full, Status* error);
  Status BatchBytes(Contribution& c, Plan& plan, size_t batch, std::shared_ptr<std::vector<uint8_t>>* out);
  void Pump(uint64_t version);
  void Fail(uint64_t version, const Status& why);
  void Finish(uint64_t version);
  void Want(PeerId from, const ParityWantMsg& m);
  // Our offer `xfer` answered by `from`: its record taken off into *out,
  // and its job (nullptr: its contribution is over, or `from` is not its
  // holder).
  Job* Answered(PeerId from, uint64_t xfer, Sent* out);
  void Refused(PeerId from, const ParityRefusedMsg& m);
  void Applied(PeerId from, const ParityAppliedMsg& m);

  // Holder side (parity_exchange_holder.cc).
  struct In {
    ParityOfferMsg offer;
    std::vector<uint8_t> bytes;
  };
  void Offer(PeerId from, ParityOfferMsg m);
  void GroupManifests(PeerId from, GroupManifestsMsg m);
  Status CheckOffer(PeerId from, const ParityOfferMsg& m) const;
  void Land(PeerId from, In& in);
  void Reply(PeerId to, uint64_t xfer, const Status& refused, bool need_full = false);

  Transport* t_;
  SnapshotStore* store_;
  char* base_;
  const GroupCode* code_;
  const Clock& clock_;
  std::vector<PeerId> members_;
  int self_ = -1;
  uint64_t epoch_ = 0;
  std::unique_ptr<ParityRows> rows_;
  uint64_t next_id_ = 1;                            // xfers, tags and tokens (kIdBit set: apart from the Replicator's)
  std::map<uint64_t, Contribution> contributions_;  // version ->
  std::map<uint64_t, Sent> sent_;                   // xfer -> an offer of ours not yet answered
  std::map<uint64_t, uint64_t> send_tokens_;        // token -> xfer
  std::map<uint64_t, std::pair<PeerId, In>> in_;    // receive token -> an offer being received
  // version -> member -> its manifests (the versions above the committed
  // one, at most kMaxManifestVersions of them, and that one).
  static constexpr size_t kMaxManifestVersions = 8;
  std::map<uint64_t, std::map<int, std::vector<Manifest>>> manifests_;
  Stats stats_;
  std::deque<Record> history_;
};

}  // namespace ftrun
