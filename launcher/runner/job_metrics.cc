#include "launcher/runner/job_metrics.h"

namespace ftrun {

JobMetrics::JobMetrics(prometheus::Registry& registry, const std::string& job) : make_(registry, {{"job", job}}) {
  committed_ = make_.Gauge("ftrun_job_committed_version", "The newest version every rank of the job can go back to");
  last_commit_ =
      make_.Gauge("ftrun_job_last_commit_timestamp_seconds", "When the newest version was committed (Unix time)");
  below_ = make_.Gauge("ftrun_job_ranks_below_redundancy",
                       "Ranks whose committed version has fewer live copies than 1 + cluster.replicas");
  nodes_lost_ = make_.Gauge("ftrun_job_nodes_lost", "Nodes of the job with no agent (lost, not yet replaced)");
  spares_ = make_.Gauge("ftrun_job_spares", "Spare agents waiting to take a lost node's place");
  running_ =
      make_.Gauge("ftrun_job_running", "1 while every node runs its ranks, 0 while forming, recovering or stopped");
  commit_lag_ = make_.Seconds("ftrun_job_commit_lag_seconds",
                              "From the report that made a version's saves known to its commit (the copies' time)");
  recovery_start_ =
      make_.Seconds("ftrun_job_recovery_start_seconds", "From a failure's detection to the start sent to every node");
  commits_ = TotalCounter(make_.Counter("ftrun_job_commits_total", "Versions committed since the job began"));
  held_reports_ = TotalCounter(make_.Counter("ftrun_job_held_reports_total", "Held reports the coordinator received"));
  restarts_ = TotalCounter(make_.Counter("ftrun_job_restarts_total", "Recoveries of the job (epochs after the first)"));
}

void JobMetrics::Update(const CoordinatorView& v) {
  if (v.committed) committed_->Set(static_cast<double>(*v.committed));
  if (commits_.Set(static_cast<double>(v.commits)) > 0) {
    last_commit_->Set(UnixNow());
    if (v.last_commit_lag_ms) commit_lag_->Observe(*v.last_commit_lag_ms / 1000.0);
  }
  held_reports_.Set(static_cast<double>(v.held_reports));
  restarts_.Set(v.restarts);
  int below = 0;
  for (int copies : v.committed_copies) below += copies < 1 + v.replicas;
  below_->Set(below);
  int lost = 0;
  for (const auto& n : v.nodes) lost += !n.agent;
  nodes_lost_->Set(lost);
  spares_->Set(static_cast<double>(v.spares.size()));
  running_->Set(v.phase == "running" ? 1 : 0);
  for (const auto& r : v.recoveries) {
    if (!r.started || r.epoch <= last_recovery_epoch_) continue;
    last_recovery_epoch_ = r.epoch;
    recovery_start_->Observe(std::chrono::duration<double>(*r.started - r.detected).count());
  }
}

}  // namespace ftrun
