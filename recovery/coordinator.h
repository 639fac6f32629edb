// Coordinator: the job's control plane. Holds membership (which agent is
// which slot, which are spares), watches heartbeats, commits versions and
// orchestrates restarts. A pure state machine: messages and time come in as
// calls (time as an argument, so tests drive it with a manual clock),
// messages go out through an Outbox. The runner hosts it over a Transport.
//
// Commit: version v is committed when, for every rank of the job, at least
// 1 + replicas live agents hold (rank, v). Agents report what they hold; the
// coordinator runs commit rounds (see cluster_messages.h: one target
// version at a time, the newest every rank holds locally); the commit is
// broadcast, and agents then release older versions.
//
// Recovery: a rank failure or a lost agent (endpoint error, or no message
// for heartbeat_misses x heartbeat_interval) bumps the epoch and halts every
// agent's ranks. A lost slot gets a spare (or waits up to lost_node_timeout
// for an agent to register for it); the replacement pulls the slot's shards
// of the last committed version from their holders, and then every slot
// starts again from that version. If some rank has no live copy, the job
// stops and the error names those ranks.
//
// State is rebuilt from the agents' registrations (their catalogs and last
// committed version), so a restarted coordinator does not lose committed
// versions.
//
// Its parts, each owning its own state: Membership (membership.h: the slots,
// the agents and their places, placement and erasure groups), CommitRounds
// (commit_rounds.h: the copies held, the rounds and the commits) and
// DiskVersions (disk_versions.h: the versions on disk a recovery can go back
// to). The coordinator itself is the inbox and the recovery: it decides who
// takes which place and what a failure costs, and sends every message.
// Files: coordinator.cc (start, commits, ticks, the view),
// coordinator_reports.cc (the inbox), coordinator_membership.cc
// (registration and replacements), coordinator_recovery.cc (epochs, the
// disk, lost copies), coordinator_erasure.cc (rebuilds from a group).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "plugin/config/config.h"
#include "plugin/protocol/cluster_messages.h"
#include "plugin/transport/transport.h"
#include "recovery/commit_rounds.h"
#include "recovery/coordinator_view.h"
#include "recovery/disk_versions.h"
#include "recovery/early_failure.h"
#include "recovery/membership.h"

namespace ftrun {

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;
  using Time = Clock::time_point;

  struct Options {
    std::vector<int> ranks_per_slot;  // one entry per slot (node)
    // The job's ranks are first_rank .. first_rank + the sum of
    // ranks_per_slot - 1, in a world of world_size ranks (0: that sum).
    // Both are 0 for a whole job; an agent started alone as one node of a
    // bigger world (DeepSpeed's launcher, no coordinator) hosts one of its
    // own ranks only.
    int first_rank = 0;
    int world_size = 0;
    std::vector<std::string> racks;  // per slot; "" = none
    int replicas = 1;
    // cluster.redundancy erasure (data 0: none; then replicas is 0): groups
    // of data + parity slots (PlaceErasureGroups), each slot's shard coded
    // across its group (coordinator_erasure.cc).
    int erasure_data = 0;
    int erasure_parity = 0;
    // (The defaults of what the config sets are the config's: one place.)
    std::chrono::milliseconds heartbeat_interval = ClusterConfig{}.heartbeat_interval;
    int heartbeat_misses = ClusterConfig{}.heartbeat_misses;  // 0: no agent is ever declared lost by its silence
    std::chrono::milliseconds lost_node_timeout = ClusterConfig{}.lost_node_timeout;
    // No commit for 3 x this while ranks save newer versions: a WARN naming
    // the ranks and holders that lag (again every 3 x this).
    std::chrono::milliseconds copy_timeout = ClusterConfig{}.copy_timeout;
    int max_restarts = JobConfig{}.max_restarts;
    int master_port = 29500;
    // The job's rendezvous store, "host:port", when a process that no rank's
    // death takes down hosts it (launcher/runner/rendezvous_keeper.h); ""
    // (or unset): each generation's rank 0 hosts it. Asked at every start.
    std::function<std::string()> store_address;
    // With a persist directory: asks for the versions complete on disk.
    // The host scans off its event loop (a scan reads every version's
    // markers, on a shared filesystem maybe for seconds, and heartbeats must
    // flow meanwhile) and answers with DiskScanned. Asked when the job forms
    // with no committed version in any agent's RAM (a job started again
    // after it was killed whole), when more nodes are lost than the replicas
    // cover, and when a node cannot read the version the job went back to.
    // Nothing starts while an answer is awaited.
    std::function<void()> scan_disk;

    // What the job's config sets: cluster.replicas and cluster.redundancy,
    // the heartbeats and timeouts of cluster.*, job.max_restarts. The
    // runner's coordinator and a one-node job's agent's take them from here.
    static Options FromConfig(const Config& c);
  };

  class Outbox {
   public:
    virtual ~Outbox() = default;
    virtual void Send(PeerId to, ClusterMsg type, std::string payload) = 0;
    virtual void Disconnect(PeerId peer) = 0;
  };

  Coordinator(Options options, Outbox* out);

  void OnMessage(PeerId from, uint16_t type, const std::string& payload, Time now);
  void OnPeerDown(PeerId peer, const std::string& why, Time now);
  void Tick(Time now);
  // Ends the job: every agent stops its ranks and exits with `code`.
  void Shutdown(int code, const std::string& message) { Stop(code, message); }

  bool done() const { return done_; }
  int exit_code() const { return exit_code_; }
  const std::string& exit_message() const { return exit_message_; }
  std::optional<uint64_t> committed() const { return rounds_.committed(); }
  uint64_t epoch() const { return epoch_; }
  // What it knows, as plain data (StatusJson in coordinator_json.h formats it).
  CoordinatorView View() const;
  // The answer to Options::scan_disk: the versions complete on disk, newest
  // first. The recovery that asked goes on. A scan that failed (the
  // persist directory cannot be listed) stops the job with exit 2: starting
  // from scratch would write over the versions it cannot see.
  void DiskScanned(const Status& scan, std::vector<uint64_t> newest_first, Time now);

 private:
  enum class Phase { kForming, kRunning, kRecovering, kStopped };
  using AgentInfo = Membership::Agent;  // (halted: since halt_epoch_)
  using RecoveryRecord = CoordinatorView::Recovery;

  // Sends one message (its struct says its type).
  template <class M>
  void Send(PeerId to, const M& m) {
    Deliver(to, M::kType, Encode(m));
  }
  // Every message to an agent goes out here (it notes when).
  void Deliver(PeerId to, ClusterMsg type, std::string payload);
  template <class M>
  void SendAll(const M& m) {
    SendAll(M::kType, Encode(m));
  }

  void Register(PeerId from, const RegisterMsg& m, Time now);
  // Agents' reports (coordinator_reports.cc).
  void OnHeld(AgentInfo& a, const HeldMsg& m, Time now);
  void OnRankFailed(const RankFailedMsg& m, Time now);
  void OnNodeDone(AgentInfo& a, const NodeDoneMsg& m);
  void OnPullFailed(AgentInfo& a, const PullFailedMsg& m, Time now);
  void Dropped(AgentInfo& a, const DroppedMsg& m, Time now);
  // An agent told to start lacks its own ranks of the committed version.
  void Missing(AgentInfo& a, uint64_t epoch, const std::vector<RankVersion>& lost, Time now);
  void BeginRecovery(const std::string& reason, int exit_code, Time now);
  // A job formed with no committed version: the newest on disk, if any.
  void RestoreFromDisk();
  // A scan of the disk for `need`; DiskScanned goes on with it.
  using DiskNeed = DiskVersions::Need;
  void ScanDisk(DiskNeed need, std::string detail);
  // The job goes back to `version` on disk: it is the committed version.
  void GoBackTo(uint64_t version);
  void DiskFailed(PeerId from, uint64_t version, const std::string& why, Time now);
  PullMsg DiskPull(int slot) const;  // read the slot's ranks of the committed version from disk
  // Every restore plan for a slot's agent goes out here: with an erasure
  // code, ranks that no copy holds get the group to rebuild from
  // (ErasurePlan).
  void SendPull(PeerId to, int slot, PullMsg p);
  // True when every rank has a live copy of the committed version, or the
  // job goes back to a version on disk (disk_restore_). False when some rank
  // has none and the job stops (naming them), or a scan of the disk is
  // asked first (DiskScanned then checks again and goes on).
  bool CheckCoverage(const std::string& detail);
  void AssignReplacements(Time now);
  void Assign(AgentInfo& a, int slot);
  void MaybeStart(Time now);
  // A version newly committed (CommitRounds::Commit) is told to every agent.
  void MaybeCommit(Time now);
  // Starts a commit round on the newest version every rank holds locally.
  void MaybeTarget(Time now);
  // A warning when commits stop (CommitRounds::Stalled).
  void WarnIfStalled(Time now);
  void Lost(PeerId peer, const std::string& why, Time now);
  void Stop(int code, const std::string& message);
  void BroadcastMembership();
  // A live copy of the rank's `version`, or (erasure) its node can be
  // rebuilt from its group.
  bool Covered(int rank, uint64_t version) const;
  void SendAll(ClusterMsg type, const std::string& payload);

  // Erasure coding (coordinator_erasure.cc). A commit needs every slot's
  // parity rows complete at the version (CommitRounds); a slot whose agent
  // is lost is rebuilt from its group while each stripe it has data in keeps
  // `data` fragments: members whose agent holds their ranks' data, or whose
  // parity rows are complete, at the version.
  bool erasure() const { return members_.erasure(); }
  void OnParityHeld(AgentInfo& a, const ParityHeldMsg& m, Time now);
  bool Rebuildable(int slot, uint64_t version) const;
  // A restore plan for `slot` that has ranks with no holder: its group.
  void ErasurePlan(int slot, PullMsg* p) const;

  Options o_;
  Outbox* out_;
  Time now_{};  // the time of the call being handled (messages sent are stamped with it)
  Membership members_;
  CommitRounds rounds_;
  std::set<std::pair<int, uint64_t>> rebuild_failed_;  // (slot, version) a replacement could not rebuild
  Phase phase_ = Phase::kForming;
  uint64_t epoch_ = 0;
  // The epoch the current recovery halted the ranks in. A re-plan of the
  // same recovery (PullAllFromDisk) moves epoch_ on but halts nothing: a
  // kHalted of any epoch since this one still means the node's ranks are gone.
  uint64_t halt_epoch_ = 0;
  bool agents_ran_ranks_ = false;  // an agent registered with ranks run before (an attach)
  int restarts_ = 0;
  int last_failure_code_ = 1;
  EarlyFailureRule early_failures_;
  std::optional<Time> waiting_since_;  // for a lost slot's agent
  std::vector<RecoveryRecord> recoveries_;
  bool done_ = false;
  bool disk_restore_ = false;  // this recovery goes back to a version on disk
  DiskVersions disk_;
  // Every node reads its ranks of the committed version from disk, in a new epoch.
  void PullAllFromDisk(Time now);
  // (agent, rank, version) an agent lacked at a start, and a recovery had it
  // pulled since; cleared by each commit.
  std::set<std::tuple<PeerId, int, uint64_t>> missing_;
  // rank -> why an agent dropped its copy (kDropped), for the error if no
  // good copy is left; cleared by each commit.
  std::map<int, std::string> dropped_why_;
  int exit_code_ = 0;
  std::string exit_message_;
};

}  // namespace ftrun
