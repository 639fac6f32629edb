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
  fenced_ = false;                     // re-admitted
  restorer_->Cancel();                 // a restore from disk in flight is stale now
  if (pulls_) pulls_->Begin(m.epoch);  // (a one-node job's plans are all from disk)
  if (m.from_disk) return PullFromDisk(m);
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
    if (holders.empty() || !pulls_) {  // (a one-node job has no holders)
      return Report(FatalMsg{
          m.epoch, "rank " + std::to_string(rank) + " version " + std::to_string(m.version) + ": no live holder"});
    }
    pulls_->Add(rank, m.version, holders);
  }
  if (pulls_)
    pulls_->Planned();
  else
    Report(ReadyMsg{m.epoch});
}

}  // namespace ftrun
