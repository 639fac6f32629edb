// The agent's status file (--status-file): what agent_view.h formats,
// gathered from the agent's parts, written atomically.
#include <unistd.h>

#include "launcher/agent/agent.h"
#include "launcher/agent/agent_view.h"
#include "plugin/common/log.h"
#include "plugin/common/safe_dir.h"

namespace ftrun {

void Agent::WriteStatus() {
  status_dirty_ = false;
  last_status_write_ = clock_.Now();
  const bool prefaulted = store_.TakePrefaulted();
  if (o_.status_file.empty() && !metrics_) return;
  AgentView v;
  v.job_id = o_.job_id;
  v.agent_pid = ::getpid();
  v.node = o_.node_rank;
  v.state = generations_->state_name();
  v.cluster = member_->View();
  v.restarts = generations_->generation();
  v.max_restarts = o_.config.job.max_restarts;
  v.committed = store_.service()->last_committed();
  v.store = store_.catalog()->Stats();
  v.prefaulted = prefaulted;
  v.store_fd = store_.arena().fd();
  v.chunks_corrupt_found = corrupt_->found();
  v.save_stalls = &stalls_;
  v.chunks_corrupt_repaired = corrupt_->repaired();
  v.sampled_chunks = kSampledChunks;
  for (const RankSlot& s : ranks_->slots()) {
    if (const Manifest* m = v.committed ? store_.catalog()->Find(s.global_rank, *v.committed) : nullptr) {
      v.committed_manifests.push_back(m);
    }
    v.ranks.push_back({s.global_rank, s.pid, s.finished, s.conn_id != 0, s.control_id != 0});
  }
  v.persist = disk_->StatusJson();
  v.recoveries = recoveries_->ToJson();
  v.warm = warm_->ToJson();
  v.rendezvous_store = o_.rendezvous_store;
  if (generations_->done()) v.exit_code = generations_->exit_code();
  if (metrics_) {
    v.metrics_address = metrics_->address();
    metrics_->metrics().Update(v);
  }
  if (o_.status_file.empty()) return;
  // Never through a link; inside the run dir (the runner's job dir), only in
  // a directory nobody else can write (safe_dir.h).
  const std::string& run_dir = o_.config.agent.run_dir;
  const bool in_run_dir = o_.status_file.compare(0, run_dir.size() + 1, run_dir + "/") == 0;
  Status s = ReplaceFile(o_.status_file, AgentStatusJson(v).dump(2) + "\n", in_run_dir);
  if (!s.ok() && s.message() != status_error_) FTRUN_LOG_WARN("cannot write status file: {}", s.message());
  status_error_ = s.ok() ? std::string() : s.message();
}

}  // namespace ftrun
