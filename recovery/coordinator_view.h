// What the coordinator knows, as plain data for whoever reports it (the
// runner's status JSON, `ftrun status`, tests): a copy, taken between
// events, so the state machine carries no output format.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ftrun {

struct CoordinatorView {
  using Time = std::chrono::steady_clock::time_point;
  struct Node {
    int node = 0;
    int ranks = 0;
    std::string rack;
    std::optional<uint32_t> agent;  // none: lost, no agent yet
    std::string address;
  };
  struct Spare {
    uint32_t agent = 0;
    std::string address;
  };
  struct Recovery {
    uint64_t epoch = 0;
    std::string reason;
    Time detected;
    std::optional<Time> started;  // kStart sent
  };
  std::string phase;  // forming, running, recovering, stopped
  uint64_t epoch = 0;
  std::optional<uint64_t> committed;
  int replicas = 0;
  int restarts = 0;
  std::vector<Node> nodes;
  std::vector<Spare> spares;
  // Live copies of the committed version per rank (its own node included):
  // 1 + replicas when the redundancy is whole. Empty with no committed version.
  std::vector<int> committed_copies;
  // Erasure coding (data 0: none): per group, its slots and how many more
  // node losses it survives at the committed version (none: nothing
  // committed; negative: a lost node cannot be rebuilt).
  int erasure_data = 0;
  int erasure_parity = 0;
  struct Group {
    std::vector<int> nodes;
    std::optional<int> survives;
  };
  std::vector<Group> groups;
  // Commits since the job began, the held reports they took (messages),
  // and the last commit's lag: from the report that made every rank's save
  // of the version known to its commit (the copies' time, not the ranks'
  // spread).
  uint64_t commits = 0;
  uint64_t held_reports = 0;
  std::optional<double> last_commit_lag_ms;
  std::vector<Recovery> recoveries;
  bool done = false;
  int exit_code = 0;
  std::string exit_message;
};

}  // namespace ftrun
