// The coordinator with erasure-coded redundancy (cluster.redundancy
// erasure): groups, the parity a commit waits for, which lost nodes can be
// rebuilt, and what a replacement rebuilds from. See coordinator.h.
#include <algorithm>

#include "plugin/common/log.h"
#include "recovery/coordinator.h"

namespace ftrun {

bool Coordinator::Covered(int rank, uint64_t version) const {
  if (!HoldersAlive(rank, version).empty()) return true;
  return erasure() && Rebuildable(members_.SlotOfRank(rank), version);
}

void Coordinator::OnParityHeld(AgentInfo& a, const ParityHeldMsg& m, Time now) {
  if (m.epoch != epoch_ || (committed_ && m.version < *committed_)) return;
  parity_held_[m.version].insert(a.id);
  while (parity_held_.size() > kMaxHeldVersions) parity_held_.erase(parity_held_.begin());
  MaybeCommit(now);
}

bool Coordinator::ParityComplete(uint64_t version) const {
  for (int s = 0; s < members_.slots(); ++s) {
    if (!ParityAt(s, version)) return false;
  }
  return true;
}

bool Coordinator::DataAt(int slot, uint64_t version) const {
  const std::optional<PeerId> id = members_.Holder(slot);
  if (!id) return false;
  for (int rank : members_.SlotRanks(slot)) {
    auto h = HoldersAlive(rank, version);
    if (std::find(h.begin(), h.end(), *id) == h.end()) return false;
  }
  return true;
}

bool Coordinator::ParityAt(int slot, uint64_t version) const {
  const std::optional<PeerId> id = members_.Holder(slot);
  if (!id || !members_.Alive(*id)) return false;
  auto it = parity_held_.find(version);
  return it != parity_held_.end() && it->second.count(*id);
}

int Coordinator::StripeFragments(int group, int stripe, uint64_t version) const {
  const std::vector<int>& slots = members_.groups()[static_cast<size_t>(group)];
  const Stripe& s = members_.stripes()[static_cast<size_t>(stripe)];
  int n = 0;
  for (const StripeFragment& f : s.data) n += DataAt(slots[static_cast<size_t>(f.member)], version) ? 1 : 0;
  for (int m : s.parity) n += ParityAt(slots[static_cast<size_t>(m)], version) ? 1 : 0;
  return n;
}

bool Coordinator::Rebuildable(int slot, uint64_t version) const {
  if (!erasure() || rebuild_failed_.count({slot, version})) return false;
  const auto [group, member] = members_.GroupOf(slot);
  const std::vector<Stripe>& stripes = members_.stripes();
  for (size_t j = 0; j < stripes.size(); ++j) {
    const auto& data = stripes[j].data;
    const bool has =
        std::any_of(data.begin(), data.end(), [m = member](const StripeFragment& f) { return f.member == m; });
    if (has && StripeFragments(group, static_cast<int>(j), version) < o_.erasure_data) return false;
  }
  return true;
}

int Coordinator::GroupMargin(int group, uint64_t version) const {
  int margin = o_.erasure_parity;
  for (size_t j = 0; j < members_.stripes().size(); ++j)
    margin = std::min(margin, StripeFragments(group, static_cast<int>(j), version) - o_.erasure_data);
  return margin;
}

void Coordinator::ErasurePlan(int slot, PullMsg* p) const {
  if (!erasure() || p->from_disk) return;
  const bool needed = std::any_of(p->ranks.begin(), p->ranks.end(), [](const auto& r) { return r.second.empty(); });
  if (!needed) return;
  const auto [group, member] = members_.GroupOf(slot);
  p->group_member = member;
  p->group.clear();
  for (int s : members_.groups()[static_cast<size_t>(group)]) {
    ErasureSource src;
    if (const std::optional<PeerId> id = members_.Holder(s); id && s != slot) {
      src.agent = *id;
      src.data = DataAt(s, p->version);
      src.parity = ParityAt(s, p->version);
    }
    p->group.push_back(src);
  }
}

}  // namespace ftrun
