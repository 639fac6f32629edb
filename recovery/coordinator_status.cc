// What the coordinator tells people: a warning when commits stop, and the status JSON (see coordinator.h).
#include <algorithm>
#include <unordered_set>

#include "plugin/common/duration.h"
#include "plugin/common/log.h"
#include "recovery/coordinator.h"

namespace ftrun {

// Replication must never stop in silence: no commit for 3 x copy_timeout
// while ranks save newer versions names what lags (each rank whose round
// version is not held at redundancy, and its holders that lack it; with an
// erasure code, the nodes whose parity rows of it are not complete).
void Coordinator::WarnIfStalled(Time now) {
  if (phase_ != Phase::kRunning || (o_.replicas == 0 && !erasure())) return;
  const auto limit = 3 * o_.copy_timeout;
  if (now - last_commit_ <= limit || now - stall_warned_ <= limit) return;
  if (held_.empty() || (committed_ && held_.rbegin()->first <= *committed_)) return;  // no newer save
  stall_warned_ = now;
  const uint64_t newest = held_.rbegin()->first;
  const uint64_t v = target_.value_or(newest);
  const int need = 1 + o_.replicas;
  std::string lag;
  for (int s = 0; s < members_.slots(); ++s) {
    for (int rank : members_.SlotRanks(s)) {
      auto h = HoldersAlive(rank, v);
      if (static_cast<int>(h.size()) >= need) continue;
      std::vector<int> missing;  // agents that should hold it and do not
      std::vector<PeerId> want;
      if (auto own = members_.Holder(s)) want.push_back(*own);
      for (int hs : members_.HoldersOf(s)) {
        if (auto holder = members_.Holder(hs)) want.push_back(*holder);
      }
      for (PeerId p : want) {
        if (std::find(h.begin(), h.end(), p) == h.end()) missing.push_back(static_cast<int>(p));
      }
      lag += (lag.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) + " held by " +
             std::to_string(h.size()) + " of " + std::to_string(need) +
             (missing.empty() ? std::string() : " (not by agent(s) " + Join(missing) + ")");
    }
  }
  if (erasure()) {
    std::vector<int> short_parity;
    for (int s = 0; s < members_.slots(); ++s) {
      if (!ParityAt(s, v)) short_parity.push_back(s);
    }
    if (!short_parity.empty())
      lag += (lag.empty() ? "" : "; ") + std::string("parity rows incomplete at node(s) ") + Join(short_parity);
  }
  FTRUN_LOG_WARN(
      "no version committed for {:.0f} ms (3 x cluster.copy_timeout) while ranks save newer ones: last "
      "committed {}, round version {}, newest saved {}; lagging: {}",
      Ms(now - last_commit_), committed_ ? std::to_string(*committed_) : std::string("none"),
      target_ ? std::to_string(*target_) : std::string("none"), newest,
      lag.empty() ? std::string("none held short (every rank's round copy is in; the commit waits)") : lag);
}

CoordinatorView Coordinator::View() const {
  CoordinatorView v;
  const char* phases[] = {"forming", "running", "recovering", "stopped"};
  v.phase = phases[static_cast<int>(phase_)];
  v.epoch = epoch_;
  v.committed = committed_;
  v.replicas = o_.replicas;
  v.restarts = restarts_;
  for (int s = 0; s < members_.slots(); ++s) {
    CoordinatorView::Node n{s, members_.RanksOf(s), members_.Rack(s), std::nullopt, {}};
    if (const AgentInfo* a = members_.SlotAgent(s)) {
      n.agent = a->id;
      n.address = a->address;
    }
    v.nodes.push_back(n);
  }
  for (const auto& [id, a] : members_.agents()) {
    if (a.alive && a.slot < 0) v.spares.push_back({id, a.address});
  }
  if (committed_) {
    // One pass over the version's holders (32,768 ranks at 4,096 nodes, and
    // the runner builds this view five times a second).
    const int first = members_.FirstRank(0), end = members_.EndRank();
    v.committed_copies.assign(static_cast<size_t>(end - first), 0);
    auto held = held_.find(*committed_);
    if (held != held_.end()) {
      std::unordered_set<PeerId> alive;
      for (const auto& [id, a] : members_.agents()) {
        if (a.alive) alive.insert(id);
      }
      for (const auto& [r, holders] : held->second) {
        if (r < first || r >= end) continue;
        int live = 0;
        for (PeerId a : holders) live += alive.count(a) ? 1 : 0;
        v.committed_copies[static_cast<size_t>(r - first)] = live;
      }
    }
  }
  v.erasure_data = o_.erasure_data;
  v.erasure_parity = o_.erasure_parity;
  for (size_t g = 0; g < members_.groups().size(); ++g) {
    CoordinatorView::Group x{members_.groups()[g], std::nullopt};
    if (committed_) x.survives = GroupMargin(static_cast<int>(g), *committed_);
    v.groups.push_back(std::move(x));
  }
  v.commits = commits_;
  v.held_reports = held_reports_;
  v.last_commit_lag_ms = last_commit_lag_ms_;
  v.recoveries = recoveries_;
  v.done = done_;
  v.exit_code = exit_code_;
  v.exit_message = exit_message_;
  return v;
}

}  // namespace ftrun
