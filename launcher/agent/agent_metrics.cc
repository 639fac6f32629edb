#include "launcher/agent/agent_metrics.h"

namespace ftrun {
namespace {

const char* const kPhases[] = {"stop", "respawn", "connect", "restore", "first_step", "total"};

}  // namespace

AgentMetrics::AgentMetrics(prometheus::Registry& registry, const std::string& job, int node)
    : make_(registry, {{"job", job}, {"node", std::to_string(node)}}) {
  committed_ = make_.Gauge("ftrun_committed_version", "The newest version every rank of the job can go back to");
  last_commit_ = make_.Gauge("ftrun_last_commit_timestamp_seconds",
                             "When this agent learned of the newest committed version (Unix time)");
  store_used_ = make_.Gauge("ftrun_store_used_bytes", "Bytes of the node's in-memory store in use");
  store_capacity_ = make_.Gauge("ftrun_store_capacity_bytes", "The node's in-memory store (store.memory_budget)");
  ranks_running_ = make_.Gauge("ftrun_ranks_running", "This node's rank processes alive and not finished");
  standbys_ready_ = make_.Gauge("ftrun_warm_standbys_ready", "Warm standbys ready to take a rank");
  flush_backlog_ = make_.Gauge("ftrun_flush_backlog_versions", "Committed versions newer than the newest on disk");
  flush_failing_ = make_.Gauge("ftrun_flush_failures_in_a_row", "Failed disk writes since the last one that worked");
  sent_ = TotalCounter(make_.Counter("ftrun_sent_bytes_total", "Chunk bytes sent to peers (copies and pulls)"));
  received_ =
      TotalCounter(make_.Counter("ftrun_received_bytes_total", "Chunk bytes received from peers (copies and pulls)"));
  corrupt_found_ = TotalCounter(
      make_.Counter("ftrun_corrupt_chunks_found_total", "Chunks in memory whose bytes no longer match their hash"));
  corrupt_repaired_ =
      TotalCounter(make_.Counter("ftrun_corrupt_chunks_repaired_total", "Of those, repaired from a peer's copy"));
  flushed_bytes_ = TotalCounter(make_.Counter("ftrun_flush_written_bytes_total", "Bytes written to persist.dir"));
  flushed_versions_ =
      TotalCounter(make_.Counter("ftrun_flush_versions_total", "Committed versions written whole to persist.dir"));
  scrubbed_ = TotalCounter(make_.Counter("ftrun_scrub_chunks_total", "Chunk files on disk read back and checked"));
  scrub_failed_ = TotalCounter(make_.Counter("ftrun_scrub_failed_chunks_total", "Of those, corrupt or missing"));
  scrub_repaired_ = TotalCounter(make_.Counter("ftrun_scrub_repaired_chunks_total", "Of those, rewritten from memory"));
  for (const char* kind : {"warm", "mixed", "cold"}) Recoveries(kind);
  for (const char* phase : kPhases) {
    phases_[phase] = make_.Seconds("ftrun_recovery_phase_seconds",
                                   "Each recovery's phases on this node: stop, respawn, connect, restore, first_step, "
                                   "total",
                                   {{"phase", phase}});
  }
  stalls_ = make_.Seconds("ftrun_save_stall_seconds",
                          "Time this node's ranks spent inside each save (the training thread held)", {},
                          SaveStalls::Bounds());
  stall_buckets_.assign(SaveStalls::Bounds().size() + 1, 0);
}

prometheus::Counter* AgentMetrics::Recoveries(const std::string& kind) {
  auto& c = recoveries_[kind];
  if (c == nullptr)
    c = make_.Counter("ftrun_recoveries_total", "Recoveries of this node's ranks, by kind", {{"kind", kind}});
  return c;
}

void AgentMetrics::Update(const AgentView& v) {
  if (v.committed) {
    committed_->Set(static_cast<double>(*v.committed));
    if (!last_committed_ || *v.committed != *last_committed_) last_commit_->Set(UnixNow());
  }
  last_committed_ = v.committed;
  store_used_->Set(static_cast<double>(v.store.used_bytes));
  store_capacity_->Set(static_cast<double>(v.store.capacity_bytes));
  int running = 0;
  for (const AgentView::Rank& r : v.ranks) running += r.pid != 0 && !r.finished;
  ranks_running_->Set(running);
  standbys_ready_->Set(v.warm.value("ready", 0));
  if (v.cluster) {
    sent_.Set(static_cast<double>(v.cluster->transport.bulk_bytes_sent));
    received_.Set(static_cast<double>(v.cluster->transport.bulk_bytes_received));
  }
  corrupt_found_.Set(static_cast<double>(v.chunks_corrupt_found));
  corrupt_repaired_.Set(static_cast<double>(v.chunks_corrupt_repaired));
  if (v.persist) {
    const nlohmann::json& p = *v.persist;
    flush_backlog_->Set(p.value("backlog_versions", 0.0));
    flush_failing_->Set(p.value("failures_in_a_row", 0.0));
    flushed_bytes_.Set(p.value("bytes_written", 0.0));
    flushed_versions_.Set(p.value("versions_written", 0.0));
    scrubbed_.Set(p.value("chunks_scrubbed", 0.0));
    scrub_failed_.Set(p.value("chunks_scrub_failed", 0.0));
    scrub_repaired_.Set(p.value("chunks_repaired", 0.0));
  }
  // The saves reported since the last update, bucket by bucket.
  if (v.save_stalls != nullptr && v.save_stalls->buckets().size() == stall_buckets_.size()) {
    std::vector<double> more(stall_buckets_.size());
    bool any = false;
    for (size_t i = 0; i < more.size(); ++i) {
      more[i] = static_cast<double>(v.save_stalls->buckets()[i] - stall_buckets_[i]);
      any |= more[i] > 0;
    }
    if (any) {
      stalls_->ObserveMultiple(more, v.save_stalls->sum_seconds() - stall_sum_);
      stall_buckets_ = v.save_stalls->buckets();
      stall_sum_ = v.save_stalls->sum_seconds();
    }
  }
  // Each recovery once it is over (its first step taken): by kind, and its phases.
  for (const nlohmann::json& r : v.recoveries) {
    const int restart = r.value("restart", 0);
    if (restart <= last_recovery_ || !r.contains("total_ms")) continue;
    last_recovery_ = restart;
    Recoveries(r.value("kind", "cold"))->Increment();
    for (const char* phase : kPhases) phases_[phase]->Observe(r.value(std::string(phase) + "_ms", 0.0) / 1000.0);
  }
}

}  // namespace ftrun
