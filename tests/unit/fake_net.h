// An in-process network for the parts of an agent that talk to other
// agents (the Replicator, the ParityExchange): messages and bulk transfers
// between FakeTransports are delivered at once; the events wait until their
// owner polls. The real transport (UCX) is tested on its own
// (tests/transport/) and with these parts in the integration tests.
#pragma once

#include <cstring>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "plugin/common/clock.h"
#include "plugin/transport/transport.h"

namespace ftrun {

// Delivers messages and bulk transfers between FakeTransports at once; the
// events wait until their owner polls.
struct FakeNet {
  struct Recv {
    void* data;
    uint64_t length;
    uint64_t token;
  };
  ManualClock clock;  // every replicator's: time moves only when a test says so
  std::map<PeerId, std::vector<TransportEvent>> events;
  std::map<std::tuple<PeerId, PeerId, uint64_t>, Recv> recvs;  // (receiver, sender, tag) ->
  bool swallow_bulk = false;  // bulk sends vanish: neither side's request ever ends (a wedged rendezvous)
  std::vector<std::pair<PeerId, PeerId>> disconnects;  // (by, peer)

  void Push(PeerId to, TransportEvent e) { events[to].push_back(std::move(e)); }
  static TransportEvent Done(uint64_t token, Status s) {
    TransportEvent e{TransportEvent::Kind::kBulkDone};
    e.token = token;
    e.status = std::move(s);
    return e;
  }
};

class FakeTransport : public Transport {
 public:
  FakeTransport(FakeNet* net, PeerId self) : net_(net), self_(self) {}
  PeerId self() const { return self_; }
  std::string address() const override { return "fake"; }
  void Connect(PeerId, const std::string&) override {}
  void Disconnect(PeerId peer) override { net_->disconnects.push_back({self_, peer}); }
  void Send(PeerId peer, uint16_t type, std::string payload) override {
    TransportEvent e{TransportEvent::Kind::kMessage};
    e.peer = self_;
    e.type = type;
    e.payload = std::move(payload);
    net_->Push(peer, std::move(e));
  }
  void SendBulk(PeerId peer, uint64_t tag, const void* data, uint64_t length, uint64_t token) override {
    if (net_->swallow_bulk) return;
    auto it = net_->recvs.find({peer, self_, tag});
    if (it == net_->recvs.end() || it->second.length != length) {
      return net_->Push(self_, FakeNet::Done(token, Status::Unavailable("no matching receive")));
    }
    std::memcpy(it->second.data, data, length);
    net_->Push(peer, FakeNet::Done(it->second.token, Status::Ok()));
    net_->Push(self_, FakeNet::Done(token, Status::Ok()));
    net_->recvs.erase(it);
  }
  void PostRecv(PeerId peer, uint64_t tag, void* data, uint64_t length, uint64_t token) override {
    net_->recvs[{self_, peer, tag}] = {data, length, token};
  }
  void CancelRecv(uint64_t token) override {
    for (auto it = net_->recvs.begin(); it != net_->recvs.end(); ++it) {
      if (std::get<0>(it->first) == self_ && it->second.token == token) {
        net_->recvs.erase(it);
        return net_->Push(self_, FakeNet::Done(token, Status::Unavailable("cancelled")));
      }
    }
  }
  int event_fd() const override { return -1; }
  std::vector<TransportEvent> Poll() override { return std::exchange(net_->events[self_], {}); }
  TransportStats stats() const override { return {}; }

 private:
  FakeNet* net_;
  PeerId self_;
};

}  // namespace ftrun
