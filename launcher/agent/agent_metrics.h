// AgentMetrics: the agent's Prometheus metrics (metrics.agent_listen), set
// from the same view as its status file (agent_view.h): the store, the
// committed version and when it came, bytes copied to and from peers, the
// flusher's backlog, writes, scrubs and repairs, corrupt chunks, every
// recovery by kind with its phases, and the ranks' save stalls. Every
// metric carries job and node labels.
//
// Not thread-safe: called from the agent's event loop.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "launcher/agent/agent_view.h"
#include "launcher/common/metric_counters.h"

namespace ftrun {

class AgentMetrics {
 public:
  AgentMetrics(prometheus::Registry& registry, const std::string& job, int node);
  void Update(const AgentView& v);

 private:
  prometheus::Counter* Recoveries(const std::string& kind);

  MetricMaker make_;
  prometheus::Gauge *committed_, *last_commit_, *store_used_, *store_capacity_, *ranks_running_, *standbys_ready_;
  prometheus::Gauge *flush_backlog_, *flush_failing_;
  TotalCounter sent_, received_, corrupt_found_, corrupt_repaired_, flushed_bytes_, flushed_versions_, scrubbed_,
      scrub_failed_, scrub_repaired_;
  std::map<std::string, prometheus::Counter*> recoveries_;  // by kind
  std::map<std::string, prometheus::Histogram*> phases_;    // by phase
  prometheus::Histogram* stalls_;
  std::vector<uint64_t> stall_buckets_;  // what stalls_ has been given, per bucket
  double stall_sum_ = 0;
  std::optional<uint64_t> last_committed_;
  int last_recovery_ = 0;  // the newest restart whose recovery is counted
};

}  // namespace ftrun
