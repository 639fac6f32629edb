// LeaderWatch: an agent's view of its job's coordinator in etcd
// (coordinator.etcd_endpoints; plugin/etcd/leader_record.h). A thread reads
// the leader key: every `fast` interval while the agent has no coordinator,
// every `slow` one while it has (a deposed leader drops its agents itself,
// and its orders are dropped by term; thousands of agents polling fast all
// the time would load etcd for nothing). The agent's loop asks for a leader newer
// than the one it follows (ClusterMember moves its coordinator link there,
// and from then on drops orders of an older term). An unreachable etcd or
// a missing key changes nothing: the agent keeps the coordinator it has.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "plugin/config/config.h"
#include "plugin/etcd/leader_record.h"

namespace ftrun {

class LeaderWatch {
 public:
  LeaderWatch(const CoordinatorConfig& config, const std::string& job, std::chrono::milliseconds fast,
              std::chrono::milliseconds slow);
  ~LeaderWatch();

  // The last leader read, when its term is above `term` and it has an address.
  std::optional<LeaderRecord> Newer(int64_t term) const;
  // Whether the agent has a coordinator now (the slow pace) or not (fast, and at once).
  void Connected(bool up);

 private:
  void Run(CoordinatorConfig config);

  const JobKeys keys_;
  const std::chrono::milliseconds fast_, slow_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool up_ = true;
  std::optional<LeaderRecord> latest_;
  std::thread thread_;
};

}  // namespace ftrun
