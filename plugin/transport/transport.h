// Transport: how agents and the coordinator talk to each other. Peers are
// named by a PeerId (a node index, or kCoordinatorPeer); a peer is "up" only
// once both sides proved the job secret (see handshake.h).
//
// Two kinds of traffic:
//  - messages: small typed control payloads, copied, delivered in order per
//    connection;
//  - bulk: a byte range sent from the sender's memory straight into a range
//    the receiver posted beforehand under the same 64-bit tag. Neither side
//    buffers the bytes; the receiver posts first, so memory is bounded by
//    what the two sides choose to have in flight. A send that finds no
//    receive posted for it (from that peer, under that tag) fails at the
//    sender and is dropped at the receiver; it is never buffered.
//
// Only the job's own agents get in: every connection proves the job secret
// both ways, and every message and bulk send on it is authenticated
// (handshake.h says how).
//
// Thread model: every method is thread-safe and returns at once (work is
// queued to the transport's own thread). What happens is reported as Events
// that the owner drains with Poll() on its own thread, whenever event_fd()
// is readable, so the owner's state needs no locks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

using PeerId = uint32_t;
inline constexpr PeerId kCoordinatorPeer = 1u << 30;

struct TransportEvent {
  enum class Kind {
    kPeerUp,    // peer proved the secret; messages may flow
    kPeerDown,  // connection lost or refused; status says why
    kMessage,   // type + payload from peer
    kBulkDone,  // a SendBulk or PostRecv with `token` finished (status)
  };
  Kind kind;
  PeerId peer = 0;
  uint16_t type = 0;
  std::string payload;
  uint64_t token = 0;
  Status status;
};

struct TransportStats {
  uint64_t bulk_bytes_sent = 0;      // completed SendBulk bytes
  uint64_t bulk_bytes_received = 0;  // completed PostRecv bytes
  uint64_t message_bytes_sent = 0;   // message payloads queued
  uint64_t connections = 0;          // connection objects held, in any state (bounded: closed ones are freed)
  uint64_t refused = 0;       // handshakes and messages refused (bad proof, bad MAC, out of sequence, over the cap)
  uint64_t bulk_dropped = 0;  // bulk sends dropped: unauthenticated sender, or no receive posted for them
};

class Transport {
 public:
  virtual ~Transport() = default;

  // The address peers reach this one at ("10.0.0.2:41234").
  virtual std::string address() const = 0;

  // Connects to `peer` at "ip:port" unless a connection is up or being made.
  // kPeerUp or kPeerDown follows.
  virtual void Connect(PeerId peer, const std::string& address) = 0;
  // Closes every connection with `peer` (kPeerDown follows if it was up).
  virtual void Disconnect(PeerId peer) = 0;

  // Queues a message; dropped (with a kPeerDown) if the peer is not up.
  virtual void Send(PeerId peer, uint16_t type, std::string payload) = 0;

  // Sends [data, data+length) to the receive `peer` posted under `tag`.
  // The range must stay valid until kBulkDone(token).
  virtual void SendBulk(PeerId peer, uint64_t tag, const void* data, uint64_t length, uint64_t token) = 0;
  // Receives one bulk send from `peer` with `tag` into [data, data+length).
  // Cancelled (kBulkDone with an error) if the peer goes down first.
  virtual void PostRecv(PeerId peer, uint64_t tag, void* data, uint64_t length, uint64_t token) = 0;

  // Cancels a posted receive; its kBulkDone still follows (with an error,
  // or OK if the bytes had already landed).
  virtual void CancelRecv(uint64_t token) = 0;

  // Readable while events are waiting.
  virtual int event_fd() const = 0;
  // Takes the waiting events (may be empty).
  virtual std::vector<TransportEvent> Poll() = 0;

  virtual TransportStats stats() const = 0;
};

}  // namespace ftrun
