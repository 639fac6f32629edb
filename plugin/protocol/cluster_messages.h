// The control protocol between agents and the coordinator, and between
// agents (replication), carried as Transport messages. Payloads are
// ByteWriter encodings; each decoder checks sizes and says what was
// malformed.
//
// Commit rounds: the coordinator picks the newest version every rank holds
// locally and tells every agent to replicate that one (kReplicate); once it
// commits, the next round picks the newest again. Every rank's copy is thus
// of the same version, whatever the speed of saves and links, and versions
// skipped between rounds are released at once. An agent reports what its
// store holds (kHeld: its ranks' saves, the copies it received) once per
// pass of its event loop, ahead of any other report.
//
// Epochs fence generations: every restart of the job's ranks bumps the
// epoch, and a report from an older epoch about a version above the last
// committed one is ignored.
//
// One struct per message (its kType names it), with its Encode and its
// Decode, which checks the payload's structure and sizes and says what was
// malformed: nothing else reads a payload's bytes. Messages of the same
// shape share a template (EpochMsg<kHalted> is the kHalted message).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ftrun/status.h"
#include "plugin/common/bytes.h"

namespace ftrun {

enum class ClusterMsg : uint16_t {
  // agent -> coordinator
  kRegister = 1,  // RegisterMsg
  kHeartbeat,     // epoch
  kHeld,          // epoch, [(rank, version)]: manifests complete in the sender's store
  kRankFailed,    // epoch, exit code (shell convention), reason, u8 early (before its first save)
  kHalted,        // epoch: the sender's ranks are gone, uncommitted versions dropped
  kReady,         // epoch: a replacement pulled every shard it was told to
  kNodeDone,      // epoch: every rank of the sender finished with 0
  kFatal,         // epoch, message: the sender cannot go on (e.g. no holder had a shard)
  kRoundFailed,   // epoch, version: the sender cannot copy that round's version (released, refused)
  kPullFailed,    // epoch, rank, version, message: no holder it was given could provide that shard
  kDiskFailed,    // epoch, version, message: the sender cannot read its ranks of that version from disk
  kDropped,       // epoch, [(rank, version)]: manifests the sender no longer holds (a chunk of theirs was corrupted)
  kMissing,       // epoch, [(rank, version)]: told to start from that version, the sender lacks these of its own ranks
  kParityHeld,    // epoch, version: every erasure parity row the sender holds is complete at that version
  // coordinator -> agent
  kAssign = 32,     // AssignMsg: the slot (node) this agent now is
  kMembership,      // MembershipMsg
  kHalt,            // epoch: stop the ranks, drop uncommitted versions, answer kHalted
  kPull,            // PullMsg
  kStart,           // StartMsg
  kCommit,          // version, epoch it was committed in (its timeline: persist markers record it)
  kStop,            // exit code, message: the job ends
  kFenced,          // message: this agent is out of the job
  kCoordHeartbeat,  // epoch
  kReplicate,       // epoch, version: copy this version of your ranks to your holders
  kDropAbove,       // version: the job went back to it and has committed a newer one: drop this node's files above it
  // agent <-> agent
  kOffer = 64,   // xfer, epoch, manifest: "store this (rank, version)"
  kWant,         // xfer, [(chunk index, tag)]: the chunks the holder lacks
  kOfferFailed,  // xfer, message
  kStored,       // xfer: the holder has the manifest and every chunk
  kPullRequest,  // xfer, epoch, rank, version: "offer me this (rank, version)"
  kAbort,        // xfer, message: the source gave up a copy it offered (e.g. a chunk corrupted at the source)
  // agent <-> agent, erasure coding (plugin/protocol/parity_messages.h)
  kParityOffer = 80,   // ParityOfferMsg: deltas of one stripe's fragment for one version
  kParityWant,         // xfer, tag: the receive is posted
  kParityRefused,      // xfer, need_full, message
  kParityApplied,      // xfer: the deltas are in the holder's row
  kGroupManifests,     // GroupManifestsMsg: a member's manifests of a version, to its group
  kFragmentRequest,    // FragmentRequestMsg: a rebuild asks a survivor for a fragment (the receive posted)
  kFragmentRefused,    // xfer, message
  kFragmentManifests,  // xfer, manifests: a lost member's, for its rebuild
  kFragmentReady,      // xfer: the survivor has the bytes staged: post the receive
  kFragmentGo,         // xfer: the receive is posted: send
};

using RankVersion = std::pair<int32_t, uint64_t>;

// A payload of one uint64 (an epoch or a version).
std::string EncodeU64(uint64_t v);
void PutRankVersions(const std::vector<RankVersion>& v, ByteWriter* w);
std::vector<RankVersion> GetRankVersions(ByteReader* r);
std::string ClusterMsgName(uint16_t type);
inline std::string ClusterMsgName(ClusterMsg type) { return ClusterMsgName(static_cast<uint16_t>(type)); }

struct RegisterMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kRegister;
  int32_t slot = -1;  // the slot this agent was started for; -1: a spare
  std::string address;
  std::string rack;
  uint64_t epoch = 0;
  std::optional<uint64_t> committed;
  std::vector<RankVersion> catalog;  // committed manifests it holds
  std::optional<uint64_t> parity;    // the committed version whose erasure parity rows it holds complete
};

struct AssignMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kAssign;
  int32_t slot = 0;
  int32_t first_rank = 0;
  int32_t local_ranks = 0;
  int32_t world_size = 0;
  int32_t num_slots = 0;
};

struct MemberInfo {
  uint32_t agent = 0;
  int32_t slot = -1;
  std::string address;
  int32_t first_rank = 0;  // the ranks of its slot: [first_rank, first_rank + ranks)
  int32_t ranks = 0;       // 0 for a spare
};

inline constexpr uint32_t kNoAgent = ~0u;  // an erasure group's member with no agent now

struct MembershipMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kMembership;
  uint64_t epoch = 0;
  // The live agents the receiver deals with: itself, its holders, the
  // agents of the slots it holds, and its erasure group's (each agent's own
  // list: the whole membership to every agent was N^2 bytes, 550 MB at
  // 4,096 nodes).
  std::vector<MemberInfo> members;
  std::vector<uint32_t> my_holders;  // agents that keep copies of the receiver's shards
  std::vector<int32_t> held_slots;   // slots whose shards the receiver keeps copies of
  // cluster.redundancy erasure (data 0: none): the receiver's group, the
  // agent of each member (kNoAgent: vacant), and the receiver's place in it.
  int32_t erasure_data = 0;
  int32_t erasure_parity = 0;
  std::vector<uint32_t> group;
  int32_t group_member = -1;
};

// What a replacement rebuilds an erasure-coded node from: each member of
// its group, and which of its fragments of the version are there.
struct ErasureSource {
  uint32_t agent = kNoAgent;
  bool data = false;    // its ranks' data (its data fragments)
  bool parity = false;  // its parity rows, complete
};

struct PullMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kPull;
  uint64_t epoch = 0;
  uint64_t version = 0;
  std::vector<std::pair<int32_t, std::vector<uint32_t>>> ranks;  // rank -> agents holding it
  bool from_disk = false;  // read the ranks from the persist directory (no holders)
  // Ranks with no holder are rebuilt from the erasure group: by member.
  std::vector<ErasureSource> group;
  int32_t group_member = -1;  // the receiver's place in it
};

struct StartMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kStart;
  uint64_t epoch = 0;
  std::optional<uint64_t> version;  // to restore; none: fresh start
  std::string master_addr;
  int32_t master_port = 0;
  std::string store;  // "host:port": the job's rendezvous store; "": rank 0 hosts it
};

// agent -> coordinator and back: an epoch only.
template <ClusterMsg T>
struct EpochMsg {
  static constexpr ClusterMsg kType = T;
  uint64_t epoch = 0;
};
using HeartbeatMsg = EpochMsg<ClusterMsg::kHeartbeat>;
using HaltedMsg = EpochMsg<ClusterMsg::kHalted>;      // the sender's ranks are gone
using ReadyMsg = EpochMsg<ClusterMsg::kReady>;        // it pulled what it was told to
using NodeDoneMsg = EpochMsg<ClusterMsg::kNodeDone>;  // every rank of it finished with 0
using HaltMsg = EpochMsg<ClusterMsg::kHalt>;          // coordinator: stop the ranks
using CoordHeartbeatMsg = EpochMsg<ClusterMsg::kCoordHeartbeat>;

// agent -> coordinator: (rank, version) pairs of the sender's epoch.
template <ClusterMsg T>
struct RankVersionsMsg {
  static constexpr ClusterMsg kType = T;
  uint64_t epoch = 0;
  std::vector<RankVersion> items;
};
using HeldMsg = RankVersionsMsg<ClusterMsg::kHeld>;        // complete in its store
using MissingMsg = RankVersionsMsg<ClusterMsg::kMissing>;  // told to start from them, it lacks them

// An epoch and a version.
template <ClusterMsg T>
struct EpochVersionMsg {
  static constexpr ClusterMsg kType = T;
  uint64_t epoch = 0;
  uint64_t version = 0;
};
using RoundFailedMsg = EpochVersionMsg<ClusterMsg::kRoundFailed>;  // agent: cannot copy the round's version
using ReplicateMsg = EpochVersionMsg<ClusterMsg::kReplicate>;      // coordinator: copy this version
using ParityHeldMsg = EpochVersionMsg<ClusterMsg::kParityHeld>;    // agent: its parity rows are complete

struct RankFailedMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kRankFailed;
  uint64_t epoch = 0;
  int32_t code = 0;    // shell convention: 128 + signal
  std::string reason;  // with the rank's last stderr lines
  bool early = false;  // before the rank's first save (EarlyFailureRule)
};

// No longer held: a chunk they use was corrupted in the sender's shared
// memory and could not be repaired there.
struct DroppedMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kDropped;
  uint64_t epoch = 0;
  std::vector<RankVersion> items;
  std::string why;  // the chunk, and what its bytes hash to: for the error if no good copy is left
};

// The sender cannot go on for a reason no restart cures: the job stops.
struct FatalMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kFatal;
  uint64_t epoch = 0;
  std::string message;
  int32_t code = 1;  // the job's exit code: 2 for a start that cannot be made (another job's files on disk)
};

struct PullFailedMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kPullFailed;
  uint64_t epoch = 0;
  int32_t rank = 0;
  uint64_t version = 0;
  std::string message;  // the last holder's error
};

struct DiskFailedMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kDiskFailed;
  uint64_t epoch = 0;
  uint64_t version = 0;
  std::string message;
};

struct CommitMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kCommit;
  uint64_t version = 0;
  uint64_t epoch = 0;  // the epoch it was committed in: its timeline, which disk markers record
};

struct StopMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kStop;
  int32_t code = 0;  // the agents' exit code
  std::string message;
};

struct FencedMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kFenced;
  std::string message;  // the whole payload
};

struct DropAboveMsg {
  static constexpr ClusterMsg kType = ClusterMsg::kDropAbove;
  uint64_t version = 0;  // the version the job went back to
};

// "malformed <name> message (N bytes)" unless `r` read all of it.
Status CheckRead(const ByteReader& r, ClusterMsg type, size_t size);

template <ClusterMsg T>
std::string Encode(const EpochMsg<T>& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.epoch);
  return w.data();
}
template <ClusterMsg T>
Status Decode(const std::string& payload, EpochMsg<T>* m) {
  ByteReader r(payload);
  m->epoch = r.Get<uint64_t>();
  return CheckRead(r, T, payload.size());
}
template <ClusterMsg T>
std::string Encode(const RankVersionsMsg<T>& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.epoch);
  PutRankVersions(m.items, &w);
  return w.data();
}
template <ClusterMsg T>
Status Decode(const std::string& payload, RankVersionsMsg<T>* m) {
  ByteReader r(payload);
  m->epoch = r.Get<uint64_t>();
  m->items = GetRankVersions(&r);
  return CheckRead(r, T, payload.size());
}
template <ClusterMsg T>
std::string Encode(const EpochVersionMsg<T>& m) {
  ByteWriter w;
  w.Put<uint64_t>(m.epoch);
  w.Put<uint64_t>(m.version);
  return w.data();
}
template <ClusterMsg T>
Status Decode(const std::string& payload, EpochVersionMsg<T>* m) {
  ByteReader r(payload);
  m->epoch = r.Get<uint64_t>();
  m->version = r.Get<uint64_t>();
  return CheckRead(r, T, payload.size());
}

std::string Encode(const RankFailedMsg& m);
std::string Encode(const FatalMsg& m);
std::string Encode(const DroppedMsg& m);
std::string Encode(const PullFailedMsg& m);
std::string Encode(const DiskFailedMsg& m);
std::string Encode(const CommitMsg& m);
std::string Encode(const StopMsg& m);
std::string Encode(const FencedMsg& m);
std::string Encode(const DropAboveMsg& m);
Status Decode(const std::string& payload, RankFailedMsg* m);
Status Decode(const std::string& payload, FatalMsg* m);
Status Decode(const std::string& payload, DroppedMsg* m);
Status Decode(const std::string& payload, PullFailedMsg* m);
Status Decode(const std::string& payload, DiskFailedMsg* m);
Status Decode(const std::string& payload, CommitMsg* m);
Status Decode(const std::string& payload, StopMsg* m);
Status Decode(const std::string& payload, FencedMsg* m);
Status Decode(const std::string& payload, DropAboveMsg* m);

std::string Encode(const RegisterMsg& m);
std::string Encode(const AssignMsg& m);
std::string Encode(const MembershipMsg& m);
std::string Encode(const PullMsg& m);
std::string Encode(const StartMsg& m);
Status Decode(const std::string& payload, RegisterMsg* m);
Status Decode(const std::string& payload, AssignMsg* m);
Status Decode(const std::string& payload, MembershipMsg* m);
Status Decode(const std::string& payload, PullMsg* m);
Status Decode(const std::string& payload, StartMsg* m);

// With coordinator.etcd: every coordinator -> agent message is prefixed with
// its sender's term (8 bytes, little-endian; launcher/runner/leadership.h),
// so an agent drops an order from a deposed coordinator.
std::string WithTerm(int64_t term, std::string payload);
// Takes the term off *payload; false when it is too short to carry one.
bool TakeTerm(std::string* payload, int64_t* term);

}  // namespace ftrun
