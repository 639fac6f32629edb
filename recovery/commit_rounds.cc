#include "recovery/commit_rounds.h"

#include <algorithm>
#include <unordered_set>

#include "plugin/common/duration.h"
#include "plugin/common/log.h"

namespace ftrun {
namespace {

constexpr auto kRoundTimeout = std::chrono::seconds(30);

}  // namespace

CommitRounds::CommitRounds(const Membership* members, int replicas, std::chrono::milliseconds copy_timeout)
    : members_(members), replicas_(replicas), copy_timeout_(copy_timeout) {}

void CommitRounds::Held(PeerId agent, const std::vector<RankVersion>& items, Time now) {
  held_reports_++;
  for (const auto& [rank, version] : items) {
    if (committed_ && version < *committed_) continue;
    auto& ranks = held_[version];
    auto& holders = ranks[rank];
    if (holders.insert(agent).second && static_cast<int>(holders.size()) == 1 + replicas_) filled_[version]++;
    if (static_cast<int>(ranks.size()) >= members_->RankCount()) held_since_.emplace(version, now);  // all saved it
    if (target_ == version) target_since_ = now;  // the round makes progress
  }
  // Bounded while nothing commits: the oldest versions go first (a round's
  // is kept).
  for (auto it = held_.begin(); held_.size() > kMaxHeldVersions && it != held_.end();) {
    if (it->first == target_) {
      ++it;
    } else {
      filled_.erase(it->first);
      it = held_.erase(it);
    }
  }
  while (held_since_.size() > kMaxHeldVersions) held_since_.erase(held_since_.begin());
}

void CommitRounds::ParityHeld(PeerId agent, uint64_t version) {
  if (committed_ && version < *committed_) return;
  parity_held_[version].insert(agent);
  while (parity_held_.size() > kMaxHeldVersions) parity_held_.erase(parity_held_.begin());
}

bool CommitRounds::RoundFailed(uint64_t version) {
  if (target_ != version) return false;
  held_.erase(version);
  filled_.erase(version);
  target_.reset();
  ahead_ = true;
  return true;
}

void CommitRounds::NotHeld(PeerId agent, int rank, uint64_t version) {
  auto v = held_.find(version);
  if (v == held_.end()) return;
  auto h = v->second.find(rank);
  if (h != v->second.end()) h->second.erase(agent);
}

void CommitRounds::NoHolders(int rank, uint64_t version) {
  auto v = held_.find(version);
  if (v != held_.end()) v->second.erase(rank);
}

void CommitRounds::Registered(PeerId agent, std::optional<uint64_t> committed, const std::vector<RankVersion>& catalog,
                              std::optional<uint64_t> parity, bool parity_counts) {
  // What it knows: a restarted coordinator re-learns commits.
  if (committed && (!committed_ || *committed > *committed_)) {
    committed_ = committed;
    FTRUN_LOG_INFO("learned committed version {} from agent {}", *committed_, agent);
  }
  for (auto& [v, ranks] : held_) {
    for (auto& [rank, holders] : ranks) holders.erase(agent);  // its old reports are void
  }
  // Its parity too: an agent started again holds none; one that kept
  // running (a new coordinator adopting it) says which committed version
  // its rows cover.
  for (auto& [v, agents] : parity_held_) agents.erase(agent);
  for (const auto& [rank, version] : catalog) {
    if (committed_ && version == *committed_) held_[version][rank].insert(agent);
  }
  if (parity && committed_ && *parity == *committed_ && parity_counts) parity_held_[*parity].insert(agent);
}

void CommitRounds::NewEpoch() {
  if (committed_) {
    held_.erase(held_.upper_bound(*committed_), held_.end());
    parity_held_.erase(parity_held_.upper_bound(*committed_), parity_held_.end());
  } else {
    held_.clear();
    parity_held_.clear();
  }
  filled_.clear();  // the new epoch's reports count again
  target_.reset();
  ahead_ = false;
}

void CommitRounds::GoBackTo(uint64_t version) {
  committed_ = version;
  held_.clear();
  filled_.clear();
  // The abandoned timeline's parity: the new one saves those version
  // numbers again, with bytes of its own, and its commits need their parity.
  parity_held_.erase(parity_held_.upper_bound(version), parity_held_.end());
}

std::optional<uint64_t> CommitRounds::Commit(Time now) {
  const int need = 1 + replicas_;
  std::optional<uint64_t> newest;
  const int count = members_->RankCount();
  for (auto& [version, ranks] : held_) {
    if (committed_ && version <= *committed_) continue;
    if (static_cast<int>(ranks.size()) < count) continue;
    if (auto f = filled_.find(version); f == filled_.end() || f->second < count) continue;
    bool all = true;
    for (int r = members_->FirstRank(); r < members_->EndRank() && all; ++r)
      all = static_cast<int>(HoldersAlive(r, version).size()) >= need;
    if (all && members_->erasure()) all = ParityComplete(version);
    if (all) newest = version;
  }
  if (!newest) return std::nullopt;
  committed_ = newest;
  last_commit_ = now;
  commits_++;
  if (auto since = held_since_.find(*newest); since != held_since_.end()) {
    last_commit_lag_ms_ = std::chrono::duration<double, std::milli>(now - since->second).count();
  }
  held_.erase(held_.begin(), held_.lower_bound(*newest));
  held_since_.erase(held_since_.begin(), held_since_.upper_bound(*newest));
  filled_.erase(filled_.begin(), filled_.upper_bound(*newest));
  parity_held_.erase(parity_held_.begin(), parity_held_.lower_bound(*newest));
  FTRUN_LOG_DEBUG("version {} committed", *newest);
  return newest;
}

std::optional<uint64_t> CommitRounds::Target(Time now) {
  // A round in progress runs to its end (the first one copies whole
  // shards); only one with no copy of its version held for 3 x
  // cluster.copy_timeout (at most kRoundTimeout: a holder refused the copy,
  // a copy hangs) gives way to a newer version. Tick asks too, so a round
  // that hears nothing still gives way.
  const auto patience = std::min<std::chrono::milliseconds>(kRoundTimeout, 3 * copy_timeout_);
  if (target_ && (!committed_ || *target_ > *committed_) && now - target_since_ < patience) return std::nullopt;
  std::optional<uint64_t> newest;
  for (auto it = held_.rbegin(); it != held_.rend() && !newest; ++it) {
    if ((committed_ && it->first <= *committed_) || static_cast<int>(it->second.size()) < members_->RankCount())
      continue;
    bool all = true;
    for (int r = members_->FirstRank(); r < members_->EndRank() && all; ++r) all = !HoldersAlive(r, it->first).empty();
    if (all) newest = it->first;
  }
  if (!newest && ahead_ && !held_.empty() && (!committed_ || held_.rbegin()->first > *committed_)) {
    newest = held_.rbegin()->first;  // the fastest rank's; the others copy it when they save it
  }
  if (!newest || newest == target_) return std::nullopt;
  target_ = newest;
  target_since_ = now;
  // Older versions not committed will never be: forget them.
  held_.erase(committed_ ? held_.upper_bound(*committed_) : held_.begin(), held_.lower_bound(*newest));
  return newest;
}

// Replication must never stop in silence: no commit for 3 x copy_timeout
// while ranks save newer versions names what lags (each rank whose round
// version is not held at redundancy, and its holders that lack it; with an
// erasure code, the nodes whose parity rows of it are not complete).
std::optional<std::string> CommitRounds::Stalled(Time now) {
  const auto limit = 3 * copy_timeout_;
  if (now - last_commit_ <= limit || now - stall_warned_ <= limit) return std::nullopt;
  if (held_.empty() || (committed_ && held_.rbegin()->first <= *committed_)) return std::nullopt;  // no newer save
  stall_warned_ = now;
  const uint64_t newest = held_.rbegin()->first;
  const uint64_t v = target_.value_or(newest);
  const int need = 1 + replicas_;
  std::string lag;
  for (int s = 0; s < members_->slots(); ++s) {
    for (int rank : members_->SlotRanks(s)) {
      auto h = HoldersAlive(rank, v);
      if (static_cast<int>(h.size()) >= need) continue;
      std::vector<int> missing;  // agents that should hold it and do not
      std::vector<PeerId> want;
      if (auto own = members_->Holder(s)) want.push_back(*own);
      for (int hs : members_->HoldersOf(s)) {
        if (auto holder = members_->Holder(hs)) want.push_back(*holder);
      }
      for (PeerId p : want) {
        if (std::find(h.begin(), h.end(), p) == h.end()) missing.push_back(static_cast<int>(p));
      }
      lag += (lag.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) + " held by " +
             std::to_string(h.size()) + " of " + std::to_string(need) +
             (missing.empty() ? std::string() : " (not by agent(s) " + JoinNumbers(missing) + ")");
    }
  }
  if (members_->erasure()) {
    std::vector<int> short_parity;
    for (int s = 0; s < members_->slots(); ++s) {
      if (!ParityAt(s, v)) short_parity.push_back(s);
    }
    if (!short_parity.empty())
      lag += (lag.empty() ? "" : "; ") + std::string("parity rows incomplete at node(s) ") + JoinNumbers(short_parity);
  }
  return fmt::format(
      "no version committed for {:.0f} ms (3 x cluster.copy_timeout) while ranks save newer ones: last "
      "committed {}, round version {}, newest saved {}; lagging: {}",
      Ms(now - last_commit_), committed_ ? std::to_string(*committed_) : std::string("none"),
      target_ ? std::to_string(*target_) : std::string("none"), newest,
      lag.empty() ? std::string("none held short (every rank's round copy is in; the commit waits)") : lag);
}

std::vector<PeerId> CommitRounds::HoldersAlive(int rank, uint64_t version) const {
  std::vector<PeerId> v;
  auto it = held_.find(version);
  if (it == held_.end()) return v;
  auto jt = it->second.find(rank);
  if (jt == it->second.end()) return v;
  for (PeerId p : jt->second) {
    if (members_->Alive(p)) v.push_back(p);
  }
  return v;
}

bool CommitRounds::DataAt(int slot, uint64_t version) const {
  const std::optional<PeerId> id = members_->Holder(slot);
  if (!id) return false;
  for (int rank : members_->SlotRanks(slot)) {
    auto h = HoldersAlive(rank, version);
    if (std::find(h.begin(), h.end(), *id) == h.end()) return false;
  }
  return true;
}

bool CommitRounds::ParityAt(int slot, uint64_t version) const {
  const std::optional<PeerId> id = members_->Holder(slot);
  if (!id || !members_->Alive(*id)) return false;
  auto it = parity_held_.find(version);
  return it != parity_held_.end() && it->second.count(*id);
}

bool CommitRounds::ParityComplete(uint64_t version) const {
  for (int s = 0; s < members_->slots(); ++s) {
    if (!ParityAt(s, version)) return false;
  }
  return true;
}

int CommitRounds::StripeFragments(int group, int stripe, uint64_t version) const {
  const std::vector<int>& slots = members_->groups()[static_cast<size_t>(group)];
  const Stripe& s = members_->stripes()[static_cast<size_t>(stripe)];
  int n = 0;
  for (const StripeFragment& f : s.data) n += DataAt(slots[static_cast<size_t>(f.member)], version) ? 1 : 0;
  for (int m : s.parity) n += ParityAt(slots[static_cast<size_t>(m)], version) ? 1 : 0;
  return n;
}

int CommitRounds::GroupMargin(int group, uint64_t version) const {
  int margin = members_->erasure_parity();
  for (size_t j = 0; j < members_->stripes().size(); ++j)
    margin = std::min(margin, StripeFragments(group, static_cast<int>(j), version) - members_->erasure_data());
  return margin;
}

std::vector<int> CommitRounds::CommittedCopies() const {
  if (!committed_) return {};
  // One pass over the version's holders (32,768 ranks at 4,096 nodes, and
  // the runner builds this view five times a second).
  const int first = members_->FirstRank(), end = members_->EndRank();
  std::vector<int> copies(static_cast<size_t>(end - first), 0);
  auto held = held_.find(*committed_);
  if (held == held_.end()) return copies;
  std::unordered_set<PeerId> alive;
  for (const auto& [id, a] : members_->agents()) {
    if (a.alive) alive.insert(id);
  }
  for (const auto& [r, holders] : held->second) {
    if (r < first || r >= end) continue;
    int live = 0;
    for (PeerId a : holders) live += alive.count(a) ? 1 : 0;
    copies[static_cast<size_t>(r - first)] = live;
  }
  return copies;
}

}  // namespace ftrun
