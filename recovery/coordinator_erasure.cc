// The coordinator with erasure-coded redundancy (cluster.redundancy
// erasure): groups, the parity a commit waits for, which lost nodes can be
// rebuilt, and what a replacement rebuilds from. See coordinator.h.
#include <algorithm>

#include "plugin/common/log.h"
#include "recovery/coordinator.h"

namespace ftrun {

bool Coordinator::Covered(int rank, uint64_t version) const {
  if (!rounds_.HoldersAlive(rank, version).empty()) return true;
  return erasure() && Rebuildable(members_.SlotOfRank(rank), version);
}

void Coordinator::OnParityHeld(AgentInfo& a, const ParityHeldMsg& m, Time now) {
  if (m.epoch != epoch_) return;
  rounds_.ParityHeld(a.id, m.version);
  MaybeCommit(now);
}

bool Coordinator::Rebuildable(int slot, uint64_t version) const {
  if (!erasure() || rebuild_failed_.count({slot, version})) return false;
  const auto [group, member] = members_.GroupOf(slot);
  const std::vector<Stripe>& stripes = members_.stripes();
  for (size_t j = 0; j < stripes.size(); ++j) {
    const auto& data = stripes[j].data;
    const bool has =
        std::any_of(data.begin(), data.end(), [m = member](const StripeFragment& f) { return f.member == m; });
    if (has && rounds_.StripeFragments(group, static_cast<int>(j), version) < o_.erasure_data) return false;
  }
  return true;
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
      src.data = rounds_.DataAt(s, p->version);
      src.parity = rounds_.ParityAt(s, p->version);
    }
    p->group.push_back(src);
  }
}

}  // namespace ftrun
