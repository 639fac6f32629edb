// LocalCoordinator: the coordinator of a one-node job (ftrun-agent started
// without --coordinator), hosted inside its agent. The same state machine
// as a cluster's (recovery/coordinator.h) decides every commit and every
// restart, so a job of one node and a job of a thousand go through one
// recovery policy. Messages both ways are queued in the process, never sent
// over UCX, and delivered by Pump on the agent's loop after each batch of
// events: neither side is ever re-entered from inside the other's handler.
//
// Not thread-safe: owned by the agent's event loop.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "recovery/coordinator.h"

namespace ftrun {

class LocalCoordinator : private Coordinator::Outbox {
 public:
  using Time = Coordinator::Time;
  // An order of the coordinator to the agent: (type, payload).
  using Deliver = std::function<void(uint16_t, const std::string&)>;

  // `agent`: the agent's id in the coordinator's membership. The agent is
  // never declared lost by its own coordinator (same thread: a silence is
  // the loop's, not a lost node's), so no heartbeats are needed.
  LocalCoordinator(Coordinator::Options options, PeerId agent);

  // A report of the agent: delivered on the next Pump.
  void Report(ClusterMsg type, std::string payload) { to_coord_.emplace_back(type, std::move(payload)); }
  // Delivers what is queued both ways until nothing is left: the agent's
  // reports to the coordinator, and the coordinator's orders to `to_agent`
  // (which may report again).
  void Pump(const Deliver& to_agent, Time now);
  void Tick(Time now) { coord_.Tick(now); }
  // The answer to the coordinator's Options::scan_disk.
  void DiskScanned(const Status& scan, std::vector<uint64_t> newest_first, Time now) {
    coord_.DiskScanned(scan, std::move(newest_first), now);
  }
  // What the coordinator knows (the job's phase, epochs, recoveries).
  CoordinatorView View() const { return coord_.View(); }

 private:
  void Send(PeerId to, ClusterMsg type, std::string payload) override;
  void Disconnect(PeerId) override {}

  const PeerId agent_;
  std::deque<std::pair<ClusterMsg, std::string>> to_coord_;
  std::deque<std::pair<ClusterMsg, std::string>> to_agent_;
  Coordinator coord_;  // last: its constructor may already send
};

}  // namespace ftrun
