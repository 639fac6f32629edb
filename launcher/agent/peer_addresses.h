// PeerAddresses: where each member of the job listens (the coordinator's
// membership), and the one rule for reaching a member through the
// transport: connect by id when the address is known (a no-op for a
// connection that is up or being made), reset a connection by closing it
// and connecting again. The agent reaches its holders (at a membership, and
// again at every heartbeat: nothing else would reconnect a failed one), a
// holder it pulls from, and a peer whose stalled copy was cancelled.
//
// Not thread-safe: owned by the agent's event loop.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "plugin/protocol/cluster_messages.h"
#include "plugin/transport/transport.h"

namespace ftrun {

class PeerAddresses {
 public:
  explicit PeerAddresses(Transport* t) : t_(t) {}

  // The membership's members replace the ones known.
  void Set(const MembershipMsg& m);
  // Connects to `peer` if its address is known.
  void Connect(PeerId peer);
  void Connect(const std::vector<PeerId>& peers);
  // Closes the connection with `peer` (a UCX rendezvous on it may never
  // end; closing fails what is left on both sides) and connects again.
  void Reset(PeerId peer);

 private:
  Transport* const t_;
  std::map<PeerId, std::string> members_;
};

}  // namespace ftrun
