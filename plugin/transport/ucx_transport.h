// UcxTransport: the Transport over UCX (ucp). One worker, owned by one
// progress thread that sleeps on the worker's event fd (and a command
// eventfd); the owner's calls are queued to it. Endpoints use peer error
// handling: a peer's death surfaces as an endpoint error, reported as
// kPeerDown. Messages are eager active messages; bulk bytes are rendezvous
// tag messages received straight into the memory the receiver posted (for
// the agent: the reserved extent of its shared-memory arena).
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
  std::string secret;        // the job secret (secret.h)
  std::string listen_ip = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: any free port (see address())
  std::chrono::milliseconds handshake_timeout{5000};
};

// Creates the worker, starts listening and starts the progress thread.
// Errors name the address it could not listen on.
Status CreateUcxTransport(const UcxTransportOptions& options, std::unique_ptr<Transport>* out);

}  // namespace ftrun
