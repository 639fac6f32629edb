// Connection bookkeeping: connect and accept (with the handshake cap),
// endpoint errors, handshake deadlines, a connection coming up, closing it,
// and freeing it once UCX is done with it.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "plugin/common/log.h"
#include "plugin/transport/ucx_transport_impl.h"

namespace ftrun {
namespace ucx {

void UcxTransport::CheckDeadlines() {
  // Every few ms, not on every pass: the scan is over every connection
  // (thousands at the coordinator), the deadlines are hundreds of ms.
  if (handshaking_in_ == 0 && connecting_.empty()) return;  // every connection is up or closed
  auto now = Clock::now();
  if (now < next_deadline_check_) return;
  next_deadline_check_ = now + kDeadlineCheckEvery;
  for (auto& c : conns_) {
    if (c->state == Conn::State::kUp || c->state == Conn::State::kClosed) continue;
    if (c->refused && now - c->started > kRefuseDelay) {
      CloseConn(c.get(), Status::Unavailable("too many connections in their handshake"));
    } else if (now - c->started > o_.handshake_timeout) {
      CloseConn(c.get(), Status::Timeout("no handshake with " + c->remote + " within " +
                                         std::to_string(o_.handshake_timeout.count()) + " ms"));
    }
  }
}

Conn* UcxTransport::NewConn(ucp_ep_h ep, bool outgoing, PeerId peer, std::string remote) {
  auto c = std::make_unique<Conn>();
  c->owner = this;
  c->ep = ep;
  c->outgoing = outgoing;
  c->peer = peer;
  c->remote = std::move(remote);
  c->started = Clock::now();
  c->state = outgoing ? Conn::State::kAwaitChallenge : Conn::State::kAwaitHello;
  if (!outgoing) ++handshaking_in_;
  Conn* raw = c.get();
  conns_.push_back(std::move(c));
  stats_.connections = conns_.size();
  return raw;
}

// Frees the closed connections whose endpoint is gone: after its close
// completed, no UCX callback can name the Conn (the error handler's arg).
// Runs only from the progress loop, after the endpoint errors were handled,
// never inside a callback or a loop over conns_.
void UcxTransport::Reap() {
  if (closed_ == 0) return;
  for (auto it = conns_.begin(); it != conns_.end();) {
    Conn* c = it->get();
    if (c->state != Conn::State::kClosed) {
      ++it;
      continue;
    }
    if (c->close_request != nullptr) {
      if (ucp_request_check_status(c->close_request) == UCS_INPROGRESS) {
        ++it;
        continue;
      }
      ucp_request_free(c->close_request);
      c->close_request = nullptr;
    }
    it = conns_.erase(it);
    --closed_;
  }
  stats_.connections = conns_.size();
}

void UcxTransport::DoConnect(PeerId peer, const std::string& address) {
  if (connecting_.count(peer) || UpConn(peer)) return;
  sockaddr_in sa;
  Status s = ParseAddress(address, &sa);
  if (!s.ok()) {
    Emit({TransportEvent::Kind::kPeerDown, peer, 0, {}, 0, s});
    return;
  }
  Conn* c = NewConn(nullptr, true, peer, address);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  ep.sockaddr.addrlen = sizeof(sa);
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxTransport::OnEpError;
  ep.err_handler.arg = c;
  ucs_status_t st = ucp_ep_create(worker_, &ep, &c->ep);
  if (st != UCS_OK) {
    c->ep = nullptr;
    c->state = Conn::State::kClosed;
    ++closed_;
    Emit({TransportEvent::Kind::kPeerDown, peer, 0, {}, 0, UcsError("cannot connect to " + address, st)});
    return;
  }
  by_ep_[c->ep] = c;
  connecting_[peer] = c;
}

void UcxTransport::OnConnRequest(ucp_conn_request_h req, void* arg) {
  auto* self = static_cast<UcxTransport*>(arg);
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  std::string remote = "?";
  if (ucp_conn_request_query(req, &attr) == UCS_OK) remote = FormatAddress(attr.client_address);
  // Over the cap the connection is accepted, never challenged, and closed
  // after kRefuseDelay (UCX 1.13's ucp_listener_reject, and a close right
  // here, can each trip an assertion in its TCP connection manager); the
  // Conn is freed once closed.
  const bool over_cap = self->handshaking_in_ >= kMaxHandshaking;
  Conn* c = self->NewConn(nullptr, false, 0, remote);
  ucp_ep_params_t ep{};
  ep.field_mask =
      UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = req;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxTransport::OnEpError;
  ep.err_handler.arg = c;
  ucs_status_t st = ucp_ep_create(self->worker_, &ep, &c->ep);
  if (st != UCS_OK) {
    c->ep = nullptr;
    self->CloseConn(c, UcsError("accept", st));
    FTRUN_LOG_WARN("cannot accept a connection from {}: {}", remote, ucs_status_string(st));
    return;
  }
  self->by_ep_[c->ep] = c;
  if (over_cap) {
    if (self->stats_.refused++ % 1000 == 0) {
      FTRUN_LOG_WARN("refused a connection from {}: {} connections are already in their handshake", remote,
                     kMaxHandshaking);
    }
    c->refused = true;
    return;
  }
  c->nonce = NewNonce();
  self->SendOnConn(c, kChallenge, c->nonce);
}

void UcxTransport::OnEpError(void* arg, ucp_ep_h, ucs_status_t st) {
  auto* c = static_cast<Conn*>(arg);
  c->owner->failed_.push_back({c, UcsError("connection with " + c->remote + " failed", st)});
}

void UcxTransport::Refuse(Conn* c, const std::string& what) {
  ++stats_.refused;
  std::string who = c->state == Conn::State::kUp || c->outgoing ? "peer " + std::to_string(c->peer) + " at " + c->remote
                                                                : "an unauthenticated peer at " + c->remote;
  FTRUN_LOG_WARN("refused {} from {}; closing the connection", what, who);
  CloseConn(c, Status::FailedPrecondition("refused " + what + " from " + who));
}

void UcxTransport::BecomeUp(Conn* c) {
  if (!c->outgoing) --handshaking_in_;
  c->state = Conn::State::kUp;
  if (c->outgoing) connecting_.erase(c->peer);
  auto& list = up_[c->peer];
  list.push_back(c);
  if (list.size() == 1) Emit({TransportEvent::Kind::kPeerUp, c->peer, 0, {}, 0, {}});
  if (!c->outgoing) {
    // A peer connects only when it has no connection with us, up or being
    // made: an older connection it made is one it gave up (its link went
    // down and it reconnected), though no error reached this side. Close
    // it, or sends (UpConn takes the oldest) would vanish into it. The new
    // one is up, so the peer is not reported down. (A connection this side
    // made stays: the two sides may have connected to each other at once.)
    std::vector<Conn*> stale;
    for (Conn* o : list) {
      if (o != c && !o->outgoing) stale.push_back(o);
    }
    for (Conn* o : stale) {
      FTRUN_LOG_DEBUG("peer {} reconnected from {}: closing its older connection from {}", c->peer, c->remote,
                      o->remote);
      CloseConn(o, Status::Unavailable("replaced by a newer connection from the same peer"));
    }
  }
  for (auto& [type, payload] : std::exchange(c->pending, {})) SendOnConn(c, type, std::move(payload));
}

Conn* UcxTransport::UpConn(PeerId peer) {
  auto it = up_.find(peer);
  return it == up_.end() || it->second.empty() ? nullptr : it->second.front();
}

void UcxTransport::CloseConn(Conn* c, const Status& why) {
  if (c->state == Conn::State::kClosed) return;
  bool was_up = c->state == Conn::State::kUp;
  if (!c->outgoing && !was_up) --handshaking_in_;
  c->state = Conn::State::kClosed;
  ++closed_;
  by_ep_.erase(c->ep);
  if (c->outgoing && connecting_.count(c->peer) && connecting_[c->peer] == c) connecting_.erase(c->peer);
  bool report = false;
  if (was_up) {
    auto& list = up_[c->peer];
    list.erase(std::remove(list.begin(), list.end(), c), list.end());
    report = list.empty();
    if (report) up_.erase(c->peer);
  } else {
    report = c->outgoing;  // a connect that never came up
  }
  if (report) {
    FTRUN_LOG_DEBUG("peer {} down: {}", c->peer, why.message());
    Emit({TransportEvent::Kind::kPeerDown, c->peer, 0, {}, 0, why});
    std::vector<Op*> cancel;  // cancelling may complete (and erase) at once
    for (auto& [token, op] : recvs_) {
      if (op->peer == c->peer) cancel.push_back(op);
    }
    for (Op* op : cancel) CancelOp(op);
  }
  if (c->ep) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(c->ep, &p);
    if (UCS_PTR_IS_PTR(r)) c->close_request = r;
    c->ep = nullptr;
  }
}

void UcxTransport::CloseAll(PeerId peer, const Status& why) {
  for (auto& c : conns_) {
    bool known = c->outgoing || c->state == Conn::State::kUp;  // an incoming one has no id before its hello
    if (known && c->peer == peer && c->state != Conn::State::kClosed) CloseConn(c.get(), why);
  }
}

}  // namespace ucx
}  // namespace ftrun
