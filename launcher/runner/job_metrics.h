// JobMetrics: the job's Prometheus metrics as its coordinator sees them
// (metrics.coordinator_listen), set from the coordinator's view
// (recovery/coordinator_view.h): the committed version and when it came,
// commits and their lag, ranks whose committed version has fewer live
// copies than the redundancy asks, nodes lost, spares, restarts, and how
// long each recovery took to start. Every metric carries a job label.
//
// Not thread-safe: called from the runner's event loop.
#pragma once

#include <optional>
#include <string>

#include "launcher/common/metric_counters.h"
#include "recovery/coordinator_view.h"

namespace ftrun {

class JobMetrics {
 public:
  JobMetrics(prometheus::Registry& registry, const std::string& job);
  void Update(const CoordinatorView& v);

 private:
  MetricMaker make_;
  prometheus::Gauge *committed_, *last_commit_, *below_, *nodes_lost_, *spares_, *running_;
  prometheus::Histogram *commit_lag_, *recovery_start_;
  TotalCounter commits_, held_reports_, restarts_;
  uint64_t last_recovery_epoch_ = 0;  // the newest recovery whose start is observed
};

}  // namespace ftrun
