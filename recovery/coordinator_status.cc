// What the coordinator tells people: a warning when commits stop, and the status JSON (see coordinator.h).
#include "recovery/coordinator.h"

#include <algorithm>

#include "plugin/common/duration.h"
#include "plugin/common/log.h"
#include "recovery/placement.h"

namespace ftrun {

// Replication must never stop in silence: no commit for 3 x copy_timeout
// while ranks save newer versions names what lags (each rank whose round
// version is not held at redundancy, and its holders that lack it).
void Coordinator::WarnIfStalled(Time now) {
  if (phase_ != Phase::kRunning || o_.replicas == 0) return;
  const auto limit = 3 * o_.copy_timeout;
  if (now - last_commit_ <= limit || now - stall_warned_ <= limit) return;
  if (held_.empty() || (committed_ && held_.rbegin()->first <= *committed_)) return;  // no newer save
  stall_warned_ = now;
  const uint64_t newest = held_.rbegin()->first;
  const uint64_t v = target_.value_or(newest);
  const int need = 1 + o_.replicas;
  std::string lag;
  for (size_t s = 0; s < slots_.size(); ++s) {
    for (int rank : SlotRanks(static_cast<int>(s))) {
      auto h = HoldersAlive(rank, v);
      if (static_cast<int>(h.size()) >= need) continue;
      std::vector<int> missing;  // agents that should hold it and do not
      std::vector<PeerId> want;
      if (slots_[s]) want.push_back(*slots_[s]);
      for (int hs : placement_[s]) {
        if (slots_[static_cast<size_t>(hs)]) want.push_back(*slots_[static_cast<size_t>(hs)]);
      }
      for (PeerId p : want) {
        if (std::find(h.begin(), h.end(), p) == h.end()) missing.push_back(static_cast<int>(p));
      }
      lag += (lag.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) + " held by " +
             std::to_string(h.size()) + " of " + std::to_string(need) +
             (missing.empty() ? std::string() : " (not by agent(s) " + Join(missing) + ")");
    }
  }
  FTRUN_LOG_WARN("no version committed for {:.0f} ms (3 x cluster.copy_timeout) while ranks save newer ones: last "
                 "committed {}, round version {}, newest saved {}; lagging: {}",
                 Ms(now - last_commit_), committed_ ? std::to_string(*committed_) : std::string("none"),
                 target_ ? std::to_string(*target_) : std::string("none"), newest,
                 lag.empty() ? std::string("none held short (every rank's round copy is in; the commit waits)") : lag);
}

nlohmann::json Coordinator::StatusJson(Time now) const {
  using nlohmann::json;
  json j;
  const char* phases[] = {"forming", "running", "recovering", "stopped"};
  j["phase"] = phases[static_cast<int>(phase_)];
  j["epoch"] = epoch_;
  j["committed_version"] = committed_ ? json(*committed_) : json(nullptr);
  j["replicas"] = o_.replicas;
  j["restarts"] = restarts_;
  j["nodes"] = json::array();
  for (size_t s = 0; s < slots_.size(); ++s) {
    json n = {{"node", s}, {"ranks", o_.ranks_per_slot[s]}, {"rack", o_.racks[s]}};
    n["agent"] = slots_[s] ? json(*slots_[s]) : json(nullptr);
    if (slots_[s]) n["address"] = agents_.at(*slots_[s]).address;
    j["nodes"].push_back(n);
  }
  j["spares"] = json::array();
  for (const auto& [id, a] : agents_) {
    if (a.alive && a.slot < 0) j["spares"].push_back({{"agent", id}, {"address", a.address}});
  }
  // Live copies of the committed version per rank (the rank's own node
  // included): 1 + replicas when the redundancy is whole.
  if (committed_) {
    json copies = json::array();
    auto v = held_.find(*committed_);
    int total = 0;
    for (int n : o_.ranks_per_slot) total += n;
    for (int r = 0; r < total; ++r) {
      int live = 0;
      if (v != held_.end() && v->second.count(r)) {
        for (PeerId a : v->second.at(r)) live += agents_.count(a) && agents_.at(a).alive ? 1 : 0;
      }
      copies.push_back(live);
    }
    j["committed_copies"] = copies;
  }
  j["recoveries"] = json::array();
  for (const auto& r : recoveries_) {
    json x = {{"epoch", r.epoch}, {"reason", r.reason}};
    x["detect_to_start_ms"] = r.started ? json(Ms(*r.started - r.detected)) : json(nullptr);
    x["detected_mono_ns"] = std::chrono::duration_cast<std::chrono::nanoseconds>(r.detected.time_since_epoch()).count();
    if (r.started) {
      x["started_mono_ns"] = std::chrono::duration_cast<std::chrono::nanoseconds>(r.started->time_since_epoch()).count();
    }
    j["recoveries"].push_back(x);
  }
  if (done_) {
    j["exit_code"] = exit_code_;
    j["exit_message"] = exit_message_;
  }
  (void)now;
  return j;
}

}  // namespace ftrun
