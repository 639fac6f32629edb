// A transport that records the connections a component asks for (and sends
// nothing): for the agent's parts that only connect and disconnect peers.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "plugin/transport/transport.h"

namespace ftrun {

struct RecordingTransport : Transport {
  int connects = 0, disconnects = 0;
  std::vector<std::pair<PeerId, std::string>> connected;  // every Connect, in order
  std::vector<PeerId> disconnected;                       // every Disconnect, in order
  std::string address() const override { return "self"; }
  void Connect(PeerId p, const std::string& address) override {
    connects++;
    connected.push_back({p, address});
  }
  void Disconnect(PeerId p) override {
    disconnects++;
    disconnected.push_back(p);
  }
  void Send(PeerId, uint16_t, std::string) override {}
  void SendBulk(PeerId, uint64_t, const void*, uint64_t, uint64_t) override {}
  void PostRecv(PeerId, uint64_t, void*, uint64_t, uint64_t) override {}
  void CancelRecv(uint64_t) override {}
  int event_fd() const override { return -1; }
  std::vector<TransportEvent> Poll() override { return {}; }
  TransportStats stats() const override { return {}; }
};

}  // namespace ftrun
