// The coordinator's recovery: a failure or a loss starts a new epoch; which copies (RAM, or the persist
// directory) cover the committed version; copies dropped or missing (see coordinator.h).
#include <algorithm>
#include <utility>

#include "plugin/common/log.h"
#include "recovery/coordinator.h"

namespace ftrun {

void Coordinator::BeginRecovery(const std::string& reason, int exit_code, Time now) {
  if (phase_ == Phase::kStopped) return;
  last_failure_code_ = exit_code == 0 ? 1 : exit_code;
  if (restarts_ >= o_.max_restarts) {
    return Stop(last_failure_code_,
                "giving up after " + std::to_string(restarts_) + " restarts (job.max_restarts): " + reason);
  }
  restarts_++;
  epoch_++;
  halt_epoch_ = epoch_;
  rounds_.NewEpoch();  // the new epoch's reports count again
  recoveries_.push_back({epoch_, reason, now, std::nullopt});
  FTRUN_LOG_WARN(
      "epoch {}: {}; restoring {}", epoch_, reason,
      committed() ? "version " + std::to_string(*committed()) : std::string("nothing (no committed version)"));
  phase_ = Phase::kRecovering;
  for (auto& [id, a] : members_.agents()) {
    a.halted = a.slot < 0;
    a.ready = true;
    a.done = false;
    if (a.alive && a.slot >= 0) Send(id, HaltMsg{epoch_});
  }
  if (!CheckCoverage("")) return;
  // A node's agent that lacks its own shards of the committed version (a
  // replacement whose pull this recovery interrupted) pulls them again; or,
  // going back to a version on disk, every node reads its ranks from there.
  bool pulls = false;
  for (auto& [id, a] : members_.agents()) {
    if (!a.alive || a.slot < 0 || !committed()) continue;
    if (disk_restore_) {
      a.ready = false;
      Send(id, DiskPull(a.slot));
      continue;
    }
    PullMsg p{epoch_, *committed(), {}};
    for (int rank : members_.SlotRanks(a.slot)) {
      auto h = rounds_.HoldersAlive(rank, *committed());
      if (std::find(h.begin(), h.end(), id) != h.end()) continue;
      p.ranks.push_back({rank, std::vector<uint32_t>(h.begin(), h.end())});
    }
    if (p.ranks.empty()) continue;
    if (!pulls) BroadcastMembership();
    pulls = true;
    a.ready = false;
    SendPull(id, a.slot, p);
  }
  waiting_since_ = now;
  AssignReplacements(now);
  MaybeStart(now);
}

void Coordinator::ScanDisk(DiskNeed need, std::string detail) {
  if (disk_.Ask(need, std::move(detail))) o_.scan_disk();  // else the answer on its way serves this need too
}

void Coordinator::GoBackTo(uint64_t version) {
  rounds_.GoBackTo(version);
  disk_.WentBackTo(version);  // what lies above it (incomplete, unreadable) is void once a newer version commits
}

void Coordinator::DiskScanned(const Status& scan, std::vector<uint64_t> newest_first, Time now) {
  now_ = now;
  const DiskNeed need = disk_.Answered();
  if (need == DiskNeed::kNone || phase_ == Phase::kStopped) return;
  if (!scan.ok()) return Stop(2, "cannot read the persist directory: " + scan.message() + "; nothing was deleted");
  disk_.Use(std::move(newest_first));
  switch (need) {
    case DiskNeed::kStart:
      if (!committed()) RestoreFromDisk();
      break;
    case DiskNeed::kCoverage:
      // A loss left some rank without a live copy: every node goes back to
      // the disk's version (or the job stops), and spares take the lost
      // nodes' places.
      if (phase_ != Phase::kRecovering || !CheckCoverage(disk_.detail())) break;
      if (disk_restore_) PullAllFromDisk(now);
      waiting_since_ = now;
      AssignReplacements(now);
      break;
    case DiskNeed::kOlder: {
      std::optional<uint64_t> older = disk_.Newest();
      if (!older) {
        Stop(1, disk_.detail() + "; no older complete version on disk");
        break;
      }
      FTRUN_LOG_WARN(
          "{}; going back to version {}, the next older one on disk (the versions given up are kept "
          "on disk until a newer version commits)",
          disk_.detail(), *older);
      GoBackTo(*older);
      disk_restore_ = true;
      PullAllFromDisk(now);
      break;
    }
    case DiskNeed::kNone:
      break;
  }
  disk_.Done();  // the disk changes: the next need scans again
  MaybeStart(now);
}

// A node could not read its ranks of `version` (a chunk that fails its hash,
// a missing file): every node goes to the next older version on disk.
void Coordinator::DiskFailed(PeerId from, uint64_t version, const std::string& why, Time now) {
  (void)now;
  if (phase_ != Phase::kRecovering || !committed() || *committed() != version) return;
  disk_.Bad(version);
  ScanDisk(DiskNeed::kOlder, "agent " + std::to_string(from) + ": " + why);
}

void Coordinator::PullAllFromDisk(Time now) {
  epoch_++;  // answers about the abandoned plan (kHeld, kReady) now carry a stale epoch
  for (auto& [id, a] : members_.agents()) {
    if (!a.alive || a.slot < 0) continue;
    a.ready = false;
    Send(id, DiskPull(a.slot));
  }
  MaybeStart(now);
}

void Coordinator::RestoreFromDisk() {
  std::optional<uint64_t> v = disk_.Newest();
  if (!v) return;
  GoBackTo(*v);
  FTRUN_LOG_WARN("no committed version in any agent's RAM: restoring version {} from the persist directory", *v);
  for (auto& [id, a] : members_.agents()) {
    if (!a.alive || a.slot < 0) continue;
    a.ready = false;
    Send(id, DiskPull(a.slot));
  }
}

void Coordinator::SendPull(PeerId to, int slot, PullMsg p) {
  ErasurePlan(slot, &p);
  Send(to, p);
}

PullMsg Coordinator::DiskPull(int slot) const {
  PullMsg p{epoch_, committed().value_or(0), {}, true};
  for (int rank : members_.SlotRanks(slot)) p.ranks.push_back({rank, {}});
  return p;
}

bool Coordinator::CheckCoverage(const std::string& detail) {
  if (!committed()) return true;
  std::vector<int> uncovered;  // (a replacement still pulling holds nothing yet)
  for (int rank = members_.FirstRank(0); rank < members_.EndRank(); ++rank) {
    if (!Covered(rank, *committed())) uncovered.push_back(rank);
  }
  if (uncovered.empty()) return true;
  const std::string redundancy = erasure() ? "cluster.redundancy erasure: data " + std::to_string(o_.erasure_data) +
                                                 ", parity " + std::to_string(o_.erasure_parity) + " per group"
                                           : "cluster.replicas: " + std::to_string(o_.replicas);
  if (o_.scan_disk && !disk_.scanned()) {
    ScanDisk(DiskNeed::kCoverage, detail);
    return false;
  }
  if (std::optional<uint64_t> d = disk_.Newest()) {
    FTRUN_LOG_WARN(
        "ranks {} have no complete copy of committed version {} on any live node ({}){}: going back to "
        "version {}, the newest complete in the persist directory ({} steps lost)",
        JoinNumbers(uncovered), *committed(), redundancy, detail, *d, *committed() - std::min(*committed(), *d));
    GoBackTo(*d);
    disk_restore_ = true;
    return true;
  }
  const std::string lost = "ranks " + JoinNumbers(uncovered) + " have no complete copy of committed version " +
                           std::to_string(*committed()) + " on any live node (" + redundancy;
  auto why = dropped_why_.find(uncovered.front());
  if (why != dropped_why_.end()) {
    // A copy corrupted in shared memory was the last: name it.
    Stop(1, "cannot restart: " + why->second + ", and no good copy of it is left: " + lost + ", " +
                (o_.scan_disk ? "none on disk" : "no persist.dir") + ")" + detail +
                "; the job stops rather than restore wrong bytes");
    return false;
  }
  Stop(1, lost + "; more nodes were lost than that covers)" + detail);
  return false;
}

// An agent dropped copies (a chunk of theirs was corrupted in its shared
// memory). They no longer count; if a restart is being planned and the agent
// lacks its own ranks of the committed version now, it pulls them first
// (a restart not planned yet does that in BeginRecovery).
void Coordinator::Dropped(AgentInfo& a, const DroppedMsg& m, Time now) {
  const std::vector<RankVersion>& lost = m.items;
  for (const auto& [rank, version] : lost) {
    if (!m.why.empty()) dropped_why_[rank] = m.why;
    rounds_.NotHeld(a.id, rank, version);
  }
  FTRUN_LOG_WARN("agent {} dropped {} snapshot(s) that use a chunk corrupted in its shared memory", a.id, lost.size());
  if (phase_ != Phase::kRecovering || a.slot < 0 || !committed() || disk_restore_) return;
  PullMsg p{epoch_, *committed(), {}};
  for (int rank : members_.SlotRanks(a.slot)) {
    auto h = rounds_.HoldersAlive(rank, *committed());
    if (std::find(h.begin(), h.end(), a.id) == h.end())
      p.ranks.push_back({rank, std::vector<uint32_t>(h.begin(), h.end())});
  }
  if (p.ranks.empty() || !CheckCoverage("")) return;
  if (disk_restore_) {  // no live copy left: every node goes back to the disk version
    for (auto& [id, x] : members_.agents()) {
      if (!x.alive || x.slot < 0) continue;
      x.ready = false;
      Send(id, DiskPull(x.slot));
    }
    return MaybeStart(now);
  }
  a.ready = false;
  BroadcastMembership();
  SendPull(a.id, a.slot, p);
}

// An agent told to start from the committed version does not hold its own
// ranks of it (it did not start them: each would fail its restore, and so
// would every restart after it). Those copies no longer count, whatever the
// epoch; a report of this epoch starts a recovery in which the agent pulls
// them from their holders (or the job goes back to the disk, or stops when
// no copy is left). The same report again, after such a pull, stops the job
// with an error rather than restart it in a loop.
void Coordinator::Missing(AgentInfo& a, uint64_t epoch, const std::vector<RankVersion>& lost, Time now) {
  std::vector<int> ranks;
  bool again = false;
  for (const auto& [rank, version] : lost) {
    rounds_.NotHeld(a.id, rank, version);
    if (epoch != epoch_ || !committed() || version != *committed()) continue;  // a newer start checks again
    // Reported before: a recovery since had it pulled (the agent answers
    // ready only once it holds it), yet it lacks it again.
    again |= missing_.count({a.id, rank, version}) > 0;
    ranks.push_back(rank);
  }
  if (ranks.empty() || phase_ != Phase::kRunning || a.slot < 0) return;
  const std::string what = "node " + std::to_string(a.slot) + " (agent " + std::to_string(a.id) +
                           ") has no copy of rank(s) " + JoinNumbers(ranks) + " of committed version " +
                           std::to_string(*committed()) + " to restore";
  if (again) {
    return Stop(1, what + ", again after pulling it: stopping rather than restarting the job in a loop");
  }
  const uint64_t version = *committed();
  const PeerId agent = a.id;
  BeginRecovery(what + "; it pulls them from their holders", 1, now);
  for (int rank : ranks) missing_.insert({agent, rank, version});
}

void Coordinator::Lost(PeerId peer, const std::string& why, Time now) {
  AgentInfo* found = members_.Find(peer);
  if (found == nullptr || !found->alive) return;
  AgentInfo& a = *found;
  a.alive = false;
  out_->Disconnect(peer);
  if (phase_ == Phase::kStopped) return;  // agents leave at the end
  int slot = a.slot;
  a.slot = -1;
  FTRUN_LOG_ERROR("agent {} ({}) lost: {}", peer, slot >= 0 ? "node " + std::to_string(slot) : std::string("spare"),
                  why);
  if (slot < 0 || phase_ == Phase::kStopped) return;
  members_.Vacate(slot);
  if (phase_ == Phase::kForming) return;
  BeginRecovery("node " + std::to_string(slot) + " (agent " + std::to_string(peer) + ") lost: " + why, 1, now);
}

}  // namespace ftrun
