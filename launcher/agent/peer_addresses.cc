#include "launcher/agent/peer_addresses.h"

namespace ftrun {

void PeerAddresses::Set(const MembershipMsg& m) {
  members_.clear();
  for (const MemberInfo& x : m.members) members_[x.agent] = x.address;
}

void PeerAddresses::Connect(PeerId peer) {
  auto it = members_.find(peer);
  if (it != members_.end()) t_->Connect(peer, it->second);
}

void PeerAddresses::Connect(const std::vector<PeerId>& peers) {
  for (PeerId p : peers) Connect(p);
}

void PeerAddresses::Reset(PeerId peer) {
  t_->Disconnect(peer);
  Connect(peer);
}

}  // namespace ftrun
