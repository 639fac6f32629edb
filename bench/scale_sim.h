// ftrun-bench scale's parts: the real Coordinator on a thread of its own,
// hosted as the runner hosts it (messages in as they come, Tick every 20 ms,
// the status view every 200 ms), joined to a fleet of simulated agents by
// an in-process transport (two mailboxes). The simulated agents speak the
// cluster protocol (plugin/protocol/cluster_messages.h) with the real encodings:
// they register, send heartbeats, report what they hold, answer halts,
// pulls and starts at once, and can go silent. scale_ucx.h runs the same
// fleet and coordinator over UCX.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "recovery/coordinator.h"

namespace ftrun::bench {

using SimClock = std::chrono::steady_clock;
using SimTime = SimClock::time_point;

// An envelope of this type to the coordinator is not a message: the
// agent's connection closed (the in-process transport's kPeerDown).
inline constexpr uint16_t kConnectionClosed = 0xffff;

struct Envelope {
  PeerId peer = 0;  // the agent it is from, or to
  uint16_t type = 0;
  std::string payload;
  uint64_t version = 0;  // a held report's version (the fleet's bookkeeping)
};

// One direction of the in-process transport.
class Mailbox {
 public:
  void Push(Envelope e);
  void PushAll(std::vector<Envelope>* batch);
  // Everything queued; when nothing is, waits for something until `until`.
  std::vector<Envelope> Take(SimTime until);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Envelope> q_;
};

// What the runner's loop does around its coordinator besides messages
// (runner.cc Loop): Tick every 20 ms, and the status view (status.json and
// the metrics) every 200 ms. Both hosts of the benchmark run it.
class RunnerTimers {
 public:
  explicit RunnerTimers(Coordinator* c) : c_(c) {}
  // Runs what is due at `now`.
  void Run(SimTime now);
  // When the next Tick is due (a host waits for messages until then).
  SimTime next_tick() const { return next_tick_; }

 private:
  Coordinator* c_;
  SimTime next_tick_ = SimClock::now(), next_status_ = next_tick_;
};

class CoordinatorThread : public Coordinator::Outbox {
 public:
  CoordinatorThread(Coordinator::Options options, Mailbox* inbox, Mailbox* to_agents);
  ~CoordinatorThread() override;  // stops and joins the thread

  // CPU seconds the coordinator's thread has used so far.
  double cpu_seconds() const { return static_cast<double>(cpu_ns_.load()) / 1e9; }
  uint64_t messages_in() const { return in_.load(); }
  uint64_t messages_out() const { return out_.load(); }

  void Send(PeerId to, ClusterMsg type, std::string payload) override;
  void Disconnect(PeerId) override {}

 private:
  void Run();

  Mailbox* inbox_;
  Mailbox* to_agents_;
  std::vector<Envelope> outgoing_;  // sent during one pass, delivered at its end
  Coordinator coordinator_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> cpu_ns_{0};
  std::atomic<uint64_t> in_{0}, out_{0};
  std::thread thread_;
};

// The simulated agents: ids 1..nodes are started for nodes 0..nodes-1, then
// the spares. Driven from one thread (the benchmark's).
class Fleet {
 public:
  Fleet(int nodes, int spares, int ranks_per_node, Mailbox* inbox, Mailbox* to_coordinator, uint64_t seed);

  void RegisterAll();
  // Handles what the coordinator sent until `until` (at least one batch);
  // the replies of a batch go out shuffled across agents, as from a fleet.
  void Pump(SimTime until);
  // A heartbeat from every agent that is not silent and sent nothing for
  // `interval` (as agents do: heartbeats fill the silences).
  void Heartbeats(SimClock::duration interval);
  // Every node reports its own ranks of version v held (in shuffled order).
  void Save(uint64_t v);
  // The agent holding `slot` sends nothing from now on; returns its id.
  PeerId Silence(int slot);
  // The agent holding `slot` dies: silent, and its connection closes (the
  // transport tells the coordinator at once); returns its id.
  PeerId Kill(int slot);

  int agents() const { return static_cast<int>(agents_.size()); }
  // When agent `id` last sent anything.
  SimTime last_sent(PeerId id) const { return agents_[id - 1].last_sent; }
  // Per version: when its last held report went out, and when the last
  // agent (of those not silent) received its commit.
  std::map<uint64_t, SimTime> last_report, committed_at;
  // Per epoch: when its first halt reached an agent, when the last
  // non-silent agent had it, and when the last slot agent had its start.
  std::map<uint64_t, SimTime> first_halt, all_halted, all_started;

 private:
  struct Agent {
    PeerId id = 0;
    int slot = -1;
    uint64_t epoch = 0;
    std::vector<int32_t> held_slots;
    bool silent = false;
    uint64_t halted_in = ~0ull, started_in = ~0ull;  // the epochs it last had a halt and a start in (none yet)
    SimTime last_sent{};
  };
  void Handle(Agent& a, const Envelope& e, std::vector<Envelope>* replies);
  std::vector<RankVersion> RanksAt(int slot, uint64_t v) const;
  void Flush(std::vector<Envelope>* replies);
  int LiveInSlots();  // agents holding a slot that are not silent

  int nodes_, ranks_per_node_;
  Mailbox* inbox_;
  Mailbox* to_coordinator_;
  std::mt19937_64 rng_;
  std::vector<Agent> agents_;  // index id - 1
  int silent_ = 0;
  int live_in_slots_ = -1;                    // LiveInSlots' count (-1: to count again)
  std::map<uint64_t, int> commits_;           // version -> agents that received its commit
  std::map<uint64_t, int> halted_, started_;  // epoch -> agents that received its halt, its start
  std::map<uint64_t, int> halts_due_;         // epoch -> nodes to halt (not silent, at its first halt)
};

}  // namespace ftrun::bench
