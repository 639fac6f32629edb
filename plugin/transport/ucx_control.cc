// Control messages: the handshake (handshake.h), then sequenced messages
// MACed under the session key (session_frame.h).
#include <cstring>
#include <string>
#include <utility>

#include "plugin/common/bytes.h"
#include "plugin/common/log.h"
#include "plugin/transport/ucx_transport_impl.h"

namespace ftrun {
namespace ucx {

ucs_status_t UcxTransport::OnAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return rndv ? UCS_ERR_UNSUPPORTED : UCS_OK;  // not ours
  auto it = self->by_ep_.find(param->reply_ep);
  if (it == self->by_ep_.end() || it->second->state == Conn::State::kClosed) return rndv ? UCS_ERR_UNSUPPORTED : UCS_OK;
  Conn* c = it->second;
  if (header_length != sizeof(WireHeader) || rndv) {  // messages are always eager
    self->Refuse(c, "a malformed message (" + std::to_string(header_length) + "-byte header)");
    return rndv ? UCS_ERR_UNSUPPORTED : UCS_OK;
  }
  WireHeader h;
  std::memcpy(&h, header, sizeof(h));
  std::string payload(static_cast<const char*>(data), length);
  if (c->state != Conn::State::kUp) {
    self->Handshake(c, static_cast<uint16_t>(h.type), payload);
  } else {
    self->Message(c, h, std::move(payload));
  }
  return UCS_OK;
}

// A control message on a connection that is up: only in sequence and with
// the session's MAC (session_frame.h); anything else closes the connection.
void UcxTransport::Message(Conn* c, const WireHeader& h, std::string payload) {
  Status s = c->session.OpenMessage(h, payload);
  if (!s.ok()) return Refuse(c, s.message());
  Emit({TransportEvent::Kind::kMessage, c->peer, static_cast<uint16_t>(h.type), std::move(payload), 0, {}});
}

void UcxTransport::Handshake(Conn* c, uint16_t type, const std::string& payload) {
  if (c->refused) return;  // never challenged: it closes soon, whatever it sends
  ByteReader r(payload);
  if (c->outgoing && c->state == Conn::State::kAwaitChallenge && type == kChallenge && payload.size() == kNonceBytes) {
    c->nonce = NewNonce();
    // Bound to both nonces and both ids: the id is the one this side meant
    // to reach, so the hello is worthless to anyone else.
    c->transcript = HandshakeTranscript(payload, c->nonce, o_.self, c->peer);
    ByteWriter w;
    w.Put<uint32_t>(o_.self);
    w.PutString(c->nonce);
    w.PutString(HandshakeMac(o_.secret, "hello", c->transcript));
    SendOnConn(c, kHello, w.data());
    c->state = Conn::State::kAwaitWelcome;
    return;
  }
  if (!c->outgoing && c->state == Conn::State::kAwaitHello && type == kHello) {
    uint32_t id = r.Get<uint32_t>();
    std::string their_nonce = r.GetString();
    std::string mac = r.GetString();
    std::string transcript = HandshakeTranscript(c->nonce, their_nonce, id, o_.self);
    if (!r.ok() || their_nonce.size() != kNonceBytes || !MacEqual(mac, HandshakeMac(o_.secret, "hello", transcript))) {
      ++stats_.refused;
      FTRUN_LOG_WARN(
          "refused a peer at {} (claims id {}): its hello does not prove the job secret for this "
          "connection and this agent (id {}): a wrong secret, or a proof relayed from another connection",
          c->remote, id, o_.self);
      return CloseConn(c, Status::FailedPrecondition("peer did not prove the job secret"));
    }
    c->peer = id;
    c->transcript = std::move(transcript);
    c->session = SessionFrames(SessionKey(o_.secret, c->transcript), c->outgoing);
    ByteWriter w;
    w.Put<uint32_t>(o_.self);
    w.PutString(HandshakeMac(o_.secret, "welcome", c->transcript));
    SendOnConn(c, kWelcome, w.data());
    return BecomeUp(c);
  }
  if (c->outgoing && c->state == Conn::State::kAwaitWelcome && type == kWelcome) {
    uint32_t id = r.Get<uint32_t>();
    std::string mac = r.GetString();
    if (!r.ok() || id != c->peer || !MacEqual(mac, HandshakeMac(o_.secret, "welcome", c->transcript))) {
      ++stats_.refused;
      FTRUN_LOG_WARN("refused peer {} at {}: its welcome does not prove the job secret for this connection", c->peer,
                     c->remote);
      return CloseConn(c, Status::FailedPrecondition("peer " + std::to_string(c->peer) + " at " + c->remote +
                                                     " did not prove the job secret"));
    }
    c->session = SessionFrames(SessionKey(o_.secret, c->transcript), c->outgoing);
    return BecomeUp(c);
  }
  ++stats_.refused;
  FTRUN_LOG_WARN("unexpected message {:#x} during the handshake with {}", type, c->remote);
  CloseConn(c, Status::Corruption("protocol error during the handshake with " + c->remote));
}

void UcxTransport::DoSend(PeerId peer, uint16_t type, std::string payload) {
  if (Conn* c = UpConn(peer)) return SendOnConn(c, type, std::move(payload));
  auto it = connecting_.find(peer);
  if (it != connecting_.end()) {
    it->second->pending.emplace_back(type, std::move(payload));
    return;
  }
  Emit({TransportEvent::Kind::kPeerDown,
        peer,
        0,
        {},
        0,
        Status::Unavailable("no connection with peer " + std::to_string(peer) + ": message dropped")});
}

void UcxTransport::SendOnConn(Conn* c, uint16_t type, std::string payload) {
  auto* op = new Op{this, Op::Kind::kMessage};
  WireHeader h{};
  h.type = type;
  // After the handshake (DoSend queues what comes before): sequenced and MACed.
  if (type < kChallenge) h = c->session.SealMessage(type, payload);
  op->header.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  op->payload = std::move(payload);
  op->peer = c->peer;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  p.cb.send = &UcxTransport::OnSendDone;
  p.user_data = op;
  void* r =
      ucp_am_send_nbx(c->ep, kAmId, op->header.data(), op->header.size(), op->payload.data(), op->payload.size(), &p);
  if (!UCS_PTR_IS_PTR(r)) delete op;  // done at once, or failed: the ep error handler reports failures
}

}  // namespace ucx
}  // namespace ftrun
