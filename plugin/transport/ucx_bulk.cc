// Bulk data: active messages bound to the session (BulkHeader in
// session_frame.h says why not tag sends), received straight into the
// memory the receiver posted; and the drain of outsiders' tag messages.
#include <cstring>
#include <string>

#include "plugin/common/log.h"
#include "plugin/transport/ucx_transport_impl.h"

namespace ftrun {
namespace ucx {

ucs_status_t UcxTransport::OnBulkAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                    const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  Conn* c = nullptr;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
    auto it = self->by_ep_.find(param->reply_ep);
    if (it != self->by_ep_.end()) c = it->second;
  }
  return self->Bulk(c, header, header_length, data, length, param);
}

// Returns what OnBulkAm returns: UCS_OK for an eager payload (copied, or
// dropped), UCS_INPROGRESS for a rendezvous being received, an error for a
// rendezvous refused (the sender's send fails with it; nothing is fetched).
ucs_status_t UcxTransport::Bulk(Conn* c, const void* header, size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
  const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
  const ucs_status_t drop = rndv ? UCS_ERR_REJECTED : UCS_OK;
  if (c == nullptr || c->state != Conn::State::kUp) {
    // Not authenticated: dropped here, nothing kept. Logged once per connection.
    ++stats_.bulk_dropped;
    if (c != nullptr && !c->warned_bulk) {
      c->warned_bulk = true;
      FTRUN_LOG_WARN("dropped bulk data from {}: it has not authenticated", c->remote);
    }
    return drop;
  }
  BulkHeader h;
  if (header_length != sizeof(h)) {
    ++stats_.bulk_dropped;
    Refuse(c, "bulk data with a malformed header");
    return drop;
  }
  std::memcpy(&h, header, sizeof(h));
  if (!c->session.OpenBulk(h, length)) {
    ++stats_.bulk_dropped;
    Refuse(c, "bulk data whose header MAC does not match the session key");
    return drop;
  }
  auto it = posted_.find({c->peer, h.tag});
  if (it == posted_.end()) {
    ++stats_.bulk_dropped;
    if (!c->warned_bulk) {
      c->warned_bulk = true;
      FTRUN_LOG_WARN("dropped bulk data from peer {} at {}: no receive posted for tag {}", c->peer, c->remote, h.tag);
    }
    return drop;
  }
  Op* op = it->second;
  posted_.erase(it);
  if (length != op->length) {  // Finish names both lengths
    recvs_.erase(op->token);
    Finish(op, UCS_OK, length);
    return drop;
  }
  if (!rndv) {
    std::memcpy(op->data, data, length);
    recvs_.erase(op->token);
    Finish(op, UCS_OK, length);
    return UCS_OK;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &UcxTransport::OnRecvDone;
  p.user_data = op;
  void* r = ucp_am_recv_data_nbx(worker_, data, op->data, length, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {  // done at once, or failed (UCP owns the descriptor either way)
    recvs_.erase(op->token);
    Finish(op, r == nullptr ? UCS_OK : UCS_PTR_STATUS(r), r == nullptr ? length : 0);
  } else {
    op->request = r;
    op->receiving = true;
    ++bulk_active_;
  }
  return UCS_INPROGRESS;
}

void UcxTransport::DoSendBulk(PeerId peer, uint64_t tag, const void* data, uint64_t length, uint64_t token) {
  Conn* c = UpConn(peer);
  if (c == nullptr) {
    Emit({TransportEvent::Kind::kBulkDone,
          peer,
          0,
          {},
          token,
          Status::Unavailable("no connection with peer " + std::to_string(peer))});
    return;
  }
  auto* op = new Op{this, Op::Kind::kBulkSend, token, length, peer};
  ++bulk_active_;
  BulkHeader h = c->session.SealBulk(tag, length);
  op->header.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;  // the receiver learns which connection (hence which session) sent it
  p.cb.send = &UcxTransport::OnSendDone;
  p.user_data = op;
  void* r = ucp_am_send_nbx(c->ep, kBulkAmId, op->header.data(), op->header.size(), data, length, &p);
  if (r == nullptr)
    Finish(op, UCS_OK, length);
  else if (UCS_PTR_IS_ERR(r))
    Finish(op, UCS_PTR_STATUS(r), 0);
  else
    op->request = r;
}

void UcxTransport::DoPostRecv(PeerId peer, uint64_t tag, void* data, uint64_t length, uint64_t token) {
  if (UpConn(peer) == nullptr) {
    Emit({TransportEvent::Kind::kBulkDone,
          peer,
          0,
          {},
          token,
          Status::Unavailable("no connection with peer " + std::to_string(peer))});
    return;
  }
  auto* op = new Op{this, Op::Kind::kBulkRecv, token, length, peer};
  op->tag = tag;
  op->data = data;
  if (!posted_.emplace(std::make_pair(peer, tag), op).second) {
    delete op;
    Emit({TransportEvent::Kind::kBulkDone,
          peer,
          0,
          {},
          token,
          Status::InvalidArgument("a receive from peer " + std::to_string(peer) + " under tag " + std::to_string(tag) +
                                  " is already posted")});
    return;
  }
  recvs_[token] = op;
}

// A receive not matched yet ends at once; one whose bytes are on their way
// is cancelled in UCX (its OnRecvDone follows).
void UcxTransport::CancelOp(Op* op) {
  if (op->receiving) {
    ucp_request_cancel(worker_, op->request);
    return;
  }
  posted_.erase({op->peer, op->tag});
  recvs_.erase(op->token);
  Finish(op, UCS_ERR_CANCELED, 0);
}

void UcxTransport::OnSendDone(void* request, ucs_status_t st, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  if (op->kind == Op::Kind::kMessage) {
    delete op;
  } else {
    op->owner->Finish(op, st, st == UCS_OK ? op->length : 0);
  }
  ucp_request_free(request);
}

void UcxTransport::OnRecvDone(void* request, ucs_status_t st, size_t length, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->owner->recvs_.erase(op->token);
  op->owner->Finish(op, st, st == UCS_OK ? length : 0);
  ucp_request_free(request);
}

void UcxTransport::Finish(Op* op, ucs_status_t st, uint64_t length) {
  Status s;
  if (st != UCS_OK) {
    s = UcsError(std::string(op->kind == Op::Kind::kBulkSend ? "bulk send to" : "bulk receive from") + " peer " +
                     std::to_string(op->peer),
                 st);
  } else if (length != op->length) {
    s = Status::Corruption("bulk transfer from peer " + std::to_string(op->peer) + " carried " +
                           std::to_string(length) + " bytes, " + std::to_string(op->length) + " expected");
  }
  if (s.ok()) (op->kind == Op::Kind::kBulkSend ? stats_.bulk_sent : stats_.bulk_received) += length;
  if (op->kind == Op::Kind::kBulkSend || op->receiving) --bulk_active_;
  last_bulk_done_ = Clock::now();
  Emit({TransportEvent::Kind::kBulkDone, op->peer, 0, {}, op->token, s});
  delete op;
}

// Bulk data is active messages (BulkHeader); this transport never posts a
// tag receive, so a tag message in the worker's unexpected queue is an
// outsider's (the old wire's tags, or an attack). Each is received,
// truncated, into a scratch buffer and dropped, a bounded number per pass:
// the queue cannot grow, and a rendezvous one is never fetched.
void UcxTransport::DrainTags() {
  for (int i = 0; i < 256; ++i) {
    ucp_tag_recv_info_t info;
    ucp_tag_message_h m = ucp_tag_probe_nb(worker_, 0, 0, 1, &info);
    if (m == nullptr) return;
    ++stats_.bulk_dropped;
    if (tags_dropped_++ % 10000 == 0) {
      FTRUN_LOG_WARN("dropped a tag message ({} bytes, tag {}) from an unknown sender: agents send none ({} so far)",
                     info.length, info.sender_tag, tags_dropped_);
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    p.cb.recv = [](void* request, ucs_status_t, const ucp_tag_recv_info_t*, void*) { ucp_request_free(request); };
    (void)ucp_tag_msg_recv_nbx(worker_, scratch_, sizeof(scratch_), m, &p);  // a request frees itself when done
  }
}

}  // namespace ucx
}  // namespace ftrun
