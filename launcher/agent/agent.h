// Agent: ftrun-agent's core. Owns the node's store (node_store.h: arena,
// catalog, commit tracker), serves the ranks over a unix socket, spawns and supervises the
// ranks, reports their saves and failures to the job's coordinator, and
// obeys it: it commits versions, halts the ranks and starts them again from
// the committed version, up to job.max_restarts times. The coordinator is
// the runner's, over UCX (--coordinator: a multi-node job, where the agent
// also replicates), or for a one-node job one the agent hosts itself
// (local_coordinator.h): one recovery policy for every job.
//
// One thread runs everything: an epoll loop over the listening socket, the
// rank connections, a signalfd (SIGCHLD, SIGTERM, SIGINT, SIGHUP), a timer
// for hang detection, stop grace periods and commit waits, the disk worker,
// and in a multi-node job the transport's event fd (cluster_member.h).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "launcher/agent/agent_metrics.h"
#include "launcher/agent/cluster_member.h"
#include "launcher/agent/connection.h"
#include "launcher/agent/corrupt_chunks.h"
#include "launcher/agent/disk_recovery.h"
#include "launcher/agent/generations.h"
#include "launcher/agent/instance_lock.h"
#include "launcher/agent/node_disk.h"
#include "launcher/agent/node_store.h"
#include "launcher/agent/options.h"
#include "launcher/agent/rank_output.h"
#include "launcher/agent/rank_processes.h"
#include "launcher/agent/rank_requests.h"
#include "launcher/agent/rank_server.h"
#include "launcher/agent/recovery_log.h"
#include "launcher/agent/save_stalls.h"
#include "launcher/common/event_loop.h"
#include "launcher/common/metrics_endpoint.h"
#include "launcher/common/supervisor.h"
#include "plugin/protocol/cluster_messages.h"

namespace ftrun {

class Agent : private ClusterMember::Orders {
 public:
  // `clock`: where every part of the agent reads the time (a ManualClock in
  // tests of its parts).
  explicit Agent(AgentOptions options, const ftrun::Clock& clock = ftrun::Clock::Steady());
  ~Agent();

  // Runs the job to its end and returns the exit code: 0 when every rank
  // finished, the failing rank's code (128+signal for a signal) when
  // restarts ran out, 128+signal when the agent itself was told to stop, 2
  // when the agent could not start.
  int Run();

 private:
  using RankSlot = RankProcesses::Slot;

  Status Setup();
  void Loop();
  void Signals();
  void Tick();
  // For the generations (generations.h): one rank's process, and what it
  // said last.
  Status SpawnRank(RankSlot& slot, int generation);
  std::string LastWords(const RankSlot& s);
  void WriteStatus();

  bool persist() const { return disk_->enabled(); }

  // The coordinator's orders (cluster_member.h): the ranks' are the
  // generations' (generations.h), the rest this node's (agent_coordinator.cc).
  RegisterMsg Registration() override;
  void Assign(const AssignMsg& m) override;
  void Start(const StartMsg& m) override { generations_->Start(m); }
  void Halt(uint64_t epoch) override;
  void Readmitted(const PullMsg& m) override;
  void Committed(uint64_t version) override;
  void Commit(const CommitMsg& m) override;
  void DropAbove(uint64_t version) override;
  void Ended(int code, const std::string& message, bool fenced) override;
  void Lost(const std::string& why) override;
  void GaveUp() override { generations_->GaveUp(); }
  void Heard(Clock::Time now) override;
  void ShardPulled(int rank, uint64_t version, PeerId from) override;
  void CorruptToSend(int rank, uint64_t version, const ChunkRef& chunk) override;
  void Changed() override { status_dirty_ = true; }
  // A multi-node job's agent: the runner's coordinator, over UCX.
  bool remote() const { return !o_.coordinator.empty(); }
  ClusterMember::Options MemberOptions();
  Generations::Parts GenerationParts();
  Generations::Hooks GenerationHooks();
  WarmRanks::Hooks WarmHooks();
  Status SpawnStandby(pid_t* pid);

  // Constant after construction, except the node's place in the job, which
  // the coordinator assigns in a multi-node job.
  AgentOptions o_;
  const ftrun::Clock& clock_;

  // Guarded by the event loop (single thread).
  InstanceLock lock_;
  NodeStore store_;  // the arena, its catalog, the committed version, retention, the ranks' store service
  EventLoop loop_;   // epoll, signals, the tick
  std::unique_ptr<RankServer> server_;       // the ranks' socket
  std::unique_ptr<RankProcesses> ranks_;     // this node's rank processes
  std::unique_ptr<RankOutput> rank_output_;  // the ranks' stderr (none with each-rank logs)
  static constexpr uint64_t kListenTag = 1;  // epoll tags below 16 are fixed sources
  static constexpr uint64_t kFlushTag = 5;   // (4: the transport's)
  std::unique_ptr<NodeDisk> disk_;           // the persist directory: the flusher, drain, go-backs, the lease
  static constexpr uint64_t kDiskTag = 6;
  std::unique_ptr<DiskRecovery> disk_recovery_;  // restores from the persist directory (after store_)
  std::unique_ptr<RecoveryLog> recoveries_;      // every restart, timed phase by phase
  std::unique_ptr<CorruptChunks> corrupt_;
  SaveStalls stalls_;  // the ranks' save stalls, for the metrics and the status
  bool status_dirty_ = true;
  Clock::Time last_status_write_;
  std::string status_error_;                              // the last status write error logged (logged once)
  std::unique_ptr<ServedMetrics<AgentMetrics>> metrics_;  // metrics.agent_listen; set with the status

  // The job's coordinator, the other agents, the copies and the pulls.
  std::unique_ptr<ClusterMember> member_;
  static constexpr uint64_t kTransportTag = 4;
  std::unique_ptr<WarmRanks> warm_;           // survivors kept across generations, standbys
  std::unique_ptr<Generations> generations_;  // this node's ranks, start to stop
  std::unique_ptr<RankRequests> requests_;    // what they ask over the socket
  // Set only while a kCommit is applied: the epoch the coordinator committed
  // it in. Commits learned otherwise (a pull's or a start's restore point)
  // have no known epoch and are not written to disk by this agent.
  std::optional<uint64_t> commit_epoch_;
  // Fenced by the coordinator, or lost it and not re-admitted since (it may
  // have been replaced): never drains to disk (NodeDisk::Drain).
  bool fenced_ = false;
  bool stop_ordered_ = false;  // the coordinator ended the job (kStop)
  bool assigned_ = false;
  static constexpr size_t kSampledChunks = 4;  // per local rank, in the status
};

}  // namespace ftrun
