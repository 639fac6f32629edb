// CoordinatorLink: an agent's connection to a remote coordinator (the
// runner's), over the agents' transport. While the coordinator is up it
// asks for a heartbeat every cluster.heartbeat_interval, and declares the
// coordinator lost on a transport error or after cluster.heartbeat_misses
// intervals with no message from it; while it is down it connects again
// every interval, and gives up once cluster.lost_node_timeout has passed
// without it. What a loss means (fencing the node's ranks, the job's end)
// is the agent's: the link only says when.
//
// Not thread-safe: driven by the agent's event loop, on a Clock.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "plugin/common/clock.h"
#include "plugin/config/config.h"
#include "plugin/transport/transport.h"

namespace ftrun {

class CoordinatorLink {
 public:
  struct Options {
    PeerId peer = 0;      // the coordinator's id on the transport
    std::string address;  // where it listens
    // (The defaults are the config's: one place.)
    std::chrono::milliseconds heartbeat_interval = ClusterConfig{}.heartbeat_interval;
    int heartbeat_misses = ClusterConfig{}.heartbeat_misses;
    std::chrono::milliseconds lost_node_timeout = ClusterConfig{}.lost_node_timeout;
  };

  CoordinatorLink(Transport* transport, Options options, const Clock& clock = Clock::Steady());

  // The first attempt; the loss clock (lost_node_timeout) starts now.
  void Connect();
  // The transport's events about the coordinator.
  void PeerUp();
  void PeerDown(const std::string& why);
  void Heard();  // any message from it
  // A newer coordinator leads at `address` (etcd said so): the link to the
  // old one is dropped (a loss, if it was up) and the next try goes there.
  void Retarget(const std::string& address, const std::string& why);
  const std::string& address() const { return o_.address; }
  // A message went to it: a heartbeat is due an interval after the last
  // message, so heartbeats fill only the silences.
  void Sent(Clock::Time now) { last_sent_ = now; }
  // Heartbeats, silence, reconnecting, giving up.
  void Tick(Clock::Time now);

  bool up() const { return up_; }
  bool gave_up() const { return gave_up_; }

  std::function<void()> on_up;                          // connected: register
  std::function<void()> on_heartbeat;                   // send one (nothing was sent for an interval)
  std::function<void()> on_interval;                    // every heartbeat interval while up
  std::function<void(const std::string& why)> on_lost;  // was up, is not
  // Down for lost_node_timeout: logged once, then called on every tick (the
  // agent ends once what it was doing allows).
  std::function<void()> on_give_up;

 private:
  void Lost(const std::string& why);

  Transport* t_;
  Options o_;
  const Clock& clock_;
  bool up_ = false;
  bool gave_up_ = false;
  Clock::Time last_heard_{}, down_since_{}, last_sent_{}, last_interval_{}, last_connect_try_{};
};

}  // namespace ftrun
