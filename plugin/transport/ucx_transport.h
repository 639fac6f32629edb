// UcxTransport: the Transport over UCX (ucp). One worker, owned by one
// progress thread that sleeps on the worker's event fd (and a command
// eventfd); the owner's calls are queued to it. Endpoints use peer error
// handling: a peer's death surfaces as an endpoint error, reported as
// kPeerDown. Messages are eager active messages; bulk bytes are active
// messages of their own (rendezvous when large) received straight into the
// memory the receiver posted (for the agent: the reserved extent of its
// shared-memory arena).
//
// What is authenticated (handshake.h has the protocol):
//  - the handshake: both sides prove the job secret, bound to both nonces
//    and both ids, so a proof cannot be replayed or relayed to another peer;
//  - every control message after it: HMAC under the connection's session
//    key over direction, a per-direction sequence number, type and payload;
//    a bad or out-of-sequence one is dropped, logged with the peer, and the
//    connection closed;
//  - bulk data: taken only from a connection that finished the handshake,
//    only into a receive posted for that peer and tag, with a header MACed
//    under its session key; anything else is dropped on arrival, never
//    buffered (the bytes themselves are checked by the replicator's hashes).
// Bounded: closed connections are freed once UCX is done with them, and at
// most kMaxHandshaking incoming connections may be in their handshake.
//
// UCX headers stay inside plugin/transport/.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "plugin/transport/transport.h"

namespace ftrun {

struct UcxTransportOptions {
  PeerId self = 0;
  std::string secret;  // the job secret (secret.h)
  std::string listen_ip = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: any free port (see address())
  std::chrono::milliseconds handshake_timeout{5000};
};

// Creates the worker, starts listening and starts the progress thread.
// Errors name the address it could not listen on.
Status CreateUcxTransport(const UcxTransportOptions& options, std::unique_ptr<Transport>* out);

}  // namespace ftrun
