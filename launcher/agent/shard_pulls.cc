#include "launcher/agent/shard_pulls.h"

#include "plugin/common/log.h"

namespace ftrun {

ShardPulls::ShardPulls(const ftrun::Clock& clock, std::chrono::milliseconds timeout, Pull pull)
    : clock_(clock), timeout_(timeout), pull_(std::move(pull)) {}

void ShardPulls::Begin(uint64_t epoch) {
  pulls_.clear();
  failed_ = false;
  epoch_ = epoch;
  started_ = clock_.Now();
}

void ShardPulls::Add(int rank, uint64_t version, std::vector<uint32_t> holders) {
  State& p = pulls_[rank];
  p = State{};
  p.holders = std::move(holders);
  p.version = version;
  Next(rank);
}

void ShardPulls::Planned() {
  if (pulls_.empty() && on_ready) on_ready(epoch_);
}

void ShardPulls::Next(int rank) {
  State& p = pulls_.at(rank);
  const PeerId h = p.holders[p.next];
  FTRUN_LOG_INFO("pulling rank {} version {} from agent {}", rank, p.version, h);
  p.xfer = pull_(h, rank, p.version);
}

void ShardPulls::Ended(uint64_t pull, PeerId from, int rank, uint64_t version, const Status& s) {
  auto it = pulls_.find(rank);
  if (it == pulls_.end() || it->second.version != version || it->second.xfer != pull) return;  // an older pull
  State& p = it->second;
  if (!s.ok()) {
    FTRUN_LOG_WARN("pull of rank {} version {} from agent {} failed: {}", rank, version, from, s.message());
    if (++p.next < p.holders.size()) return Next(rank);
    if (++p.round < kRounds) {
      FTRUN_LOG_INFO("pull of rank {} version {}: asking its {} holder(s) once more", rank, version, p.holders.size());
      p.next = 0;
      return Next(rank);
    }
    pulls_.erase(it);
    failed_ = true;  // never "ready": the coordinator decides
    if (on_failed) on_failed(PullFailedMsg{epoch_, rank, version, s.message()});
    return;
  }
  pulls_.erase(it);
  if (on_pulled) on_pulled(rank, version, from);
  if (pulls_.empty() && !failed_) {
    FTRUN_LOG_INFO("pulled every shard of version {} in {:.0f} ms", version,
                   std::chrono::duration<double, std::milli>(clock_.Now() - started_).count());
    if (on_ready) on_ready(epoch_);
  }
}

void ShardPulls::Tick(ftrun::Clock::Time now) {
  if (pulls_.empty() || failed_ || now - started_ <= timeout_) return;
  // A pull that never ends must not hang the job: the coordinator decides.
  const auto& [rank, p] = *pulls_.begin();
  FTRUN_LOG_ERROR("pull of rank {} version {} did not finish within {} ms (cluster.lost_node_timeout)", rank, p.version,
                  timeout_.count());
  failed_ = true;
  if (on_failed) {
    on_failed(PullFailedMsg{epoch_, rank, p.version, "no answer from the holders within cluster.lost_node_timeout"});
  }
}

}  // namespace ftrun
