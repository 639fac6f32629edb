#include "plugin/replication/peer_roles.h"

namespace ftrun {

PeerRoles::PeerRoles(const MembershipMsg& m) : known_(true), epoch_(m.epoch) {
  for (const MemberInfo& x : m.members) members_[x.agent] = Member{x.slot, x.first_rank, x.ranks};
  held_slots_.insert(m.held_slots.begin(), m.held_slots.end());
}

Status PeerRoles::RunsRank(PeerId peer, int rank, const Member** member) const {
  const std::string who = "agent " + std::to_string(peer);
  if (!known_) return Status::FailedPrecondition(who + ": no membership has reached this agent yet");
  auto it = members_.find(peer);
  if (it == members_.end()) {
    return Status::FailedPrecondition(who + " is not a member of the job (membership of epoch " +
                                      std::to_string(epoch_) + "): fenced, or never admitted");
  }
  const Member& x = it->second;
  if (x.slot < 0) return Status::FailedPrecondition(who + " is a spare: it runs no ranks");
  if (rank < x.first_rank || rank >= x.first_rank + x.ranks) {
    return Status::FailedPrecondition(who + " runs node " + std::to_string(x.slot) + " (ranks " +
                                      std::to_string(x.first_rank) + ".." + std::to_string(x.first_rank + x.ranks - 1) +
                                      "), not rank " + std::to_string(rank));
  }
  *member = &x;
  return Status::Ok();
}

Status PeerRoles::MayOffer(PeerId peer, int rank) const {
  const Member* x = nullptr;
  Status s = RunsRank(peer, rank, &x);
  if (!s.ok()) return s;
  if (!held_slots_.count(x->slot)) {
    return Status::FailedPrecondition("agent " + std::to_string(peer) + " runs node " + std::to_string(x->slot) +
                                      ", whose copies this agent does not keep (membership of epoch " +
                                      std::to_string(epoch_) + ")");
  }
  return Status::Ok();
}

Status PeerRoles::MayPull(PeerId peer, int rank) const {
  const Member* x = nullptr;
  return RunsRank(peer, rank, &x);
}

}  // namespace ftrun
