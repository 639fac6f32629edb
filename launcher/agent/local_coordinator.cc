#include "launcher/agent/local_coordinator.h"

namespace ftrun {
namespace {

Coordinator::Options OneNode(Coordinator::Options o) {
  o.heartbeat_misses = 0;  // never lost: see the header
  return o;
}

}  // namespace

LocalCoordinator::LocalCoordinator(Coordinator::Options options, PeerId agent)
    : agent_(agent), coord_(OneNode(std::move(options)), this) {}

void LocalCoordinator::Send(PeerId to, ClusterMsg type, std::string payload) {
  if (to == agent_) to_agent_.emplace_back(type, std::move(payload));
}

void LocalCoordinator::Pump(const Deliver& to_agent, Time now) {
  while (!to_coord_.empty() || !to_agent_.empty()) {
    while (!to_coord_.empty()) {
      auto [type, payload] = std::move(to_coord_.front());
      to_coord_.pop_front();
      coord_.OnMessage(agent_, static_cast<uint16_t>(type), payload, now);
    }
    while (!to_agent_.empty()) {
      auto [type, payload] = std::move(to_agent_.front());
      to_agent_.pop_front();
      to_agent(static_cast<uint16_t>(type), payload);
    }
  }
}

}  // namespace ftrun
