// The agent's pulls in a cluster: a node's shards of the committed version, from their holders over UCX
// (or from the persist directory), before its ranks start.
#include <sys/epoll.h>

#include <algorithm>

#include "launcher/agent/agent.h"
#include "plugin/common/log.h"
#include "plugin/transport/secret.h"
#include "plugin/transport/ucx_transport.h"

namespace ftrun {

void Agent::StartPulls(const PullMsg& m) {
  JoinEpoch(m.epoch);
  fenced_ = false;  // re-admitted
  pulls_.clear();
  pull_failed_ = false;
  pull_epoch_ = m.epoch;
  pull_started_ = clock_.Now();
  ++pull_seq_;  // a restore from disk in flight is stale now
  next_restore_.reset();
  if (m.from_disk) {
    if (restore_) {  // its read in flight ends first (DiskRestoreStale starts this one)
      next_restore_ = m;
      return;
    }
    return PullFromDisk(m);
  }
  if (!m.ranks.empty()) {
    // The committed version (a replacement may never have seen its commit):
    // a halt before the start must not drop it as uncommitted.
    tracker_.Committed(m.version);
    service_->OnCommitted(m.version);
  }
  for (const auto& [rank, holders] : m.ranks) {
    if (store_->Find(rank, m.version)) {  // already here (an earlier pull finished)
      Report(HeldMsg{m.epoch, {{rank, m.version}}});
      continue;
    }
    if (holders.empty() || !replicator_) {  // (a one-node job has no holders)
      return Report(FatalMsg{
          m.epoch, "rank " + std::to_string(rank) + " version " + std::to_string(m.version) + ": no live holder"});
    }
    PullState& p = pulls_[rank];
    p.holders = holders;
    p.version = m.version;
    PullFrom(rank);
  }
  if (pulls_.empty()) Report(ReadyMsg{m.epoch});
}

void Agent::PullFrom(int rank) {
  PullState& p = pulls_.at(rank);
  PeerId h = p.holders[p.next];
  auto it = members_.find(h);
  if (it != members_.end()) transport_->Connect(h, it->second);
  FTRUN_LOG_INFO("pulling rank {} version {} from agent {}", rank, p.version, h);
  p.xfer = replicator_->Pull(h, rank, p.version);
}

void Agent::PullEnded(uint64_t pull, PeerId from, int rank, uint64_t version, const Status& s) {
  auto it = pulls_.find(rank);
  if (it == pulls_.end() || it->second.version != version || it->second.xfer != pull) return;  // an older pull
  if (!s.ok()) {
    FTRUN_LOG_WARN("pull of rank {} version {} from agent {} failed: {}", rank, version, from, s.message());
    if (++it->second.next < it->second.holders.size()) return PullFrom(rank);
    if (++it->second.round < kPullRounds) {
      FTRUN_LOG_INFO("pull of rank {} version {}: asking its {} holder(s) once more", rank, version,
                     it->second.holders.size());
      it->second.next = 0;
      return PullFrom(rank);
    }
    pulls_.erase(it);
    pull_failed_ = true;  // never "ready": the coordinator decides
    return Report(PullFailedMsg{pull_epoch_, rank, version, s.message()});
  }
  pulls_.erase(it);
  for (auto c = corrupt_.begin(); c != corrupt_.end();) {
    if (c->dropped && c->rank == rank && c->version == version) {
      CorruptRepaired(*c, "agent " + std::to_string(from));
      c = corrupt_.erase(c);
    } else {
      ++c;
    }
  }
  if (pulls_.empty() && !pull_failed_) {
    FTRUN_LOG_INFO("pulled every shard of version {} in {:.0f} ms", version,
                   std::chrono::duration<double, std::milli>(clock_.Now() - pull_started_).count());
    Report(ReadyMsg{pull_epoch_});
  }
}

}  // namespace ftrun
