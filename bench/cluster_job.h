// A job of the `ftrun` runner's local launcher (every node an agent on
// this machine, ftrun-synthetic ranks), for the multi-node scenarios: start
// it, read its status and its agents', and kill one of its nodes whole.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ftrun::bench {

struct Job {
  pid_t runner = 0;
  std::string dir, status;
};

// `config`: the YAML of the job (the run dir is added); `trainer`: the
// synthetic trainer's flags.
Job StartJob(const std::string& name, int nodes, int per_node, int spares, const std::string& config,
             const std::vector<std::string>& trainer);

// Agent `agent`'s status file, as the runner's status names it.
bool AgentStatus(const nlohmann::json& runner, int agent, nlohmann::json* out);

// SIGKILLs node `node` whole (its agent and its ranks) as the runner's
// status `st` names them; returns when it was killed (MonoNs), 0 if it has
// no agent.
int64_t KillNode(const nlohmann::json& st, int node);

// Waits (until `deadline`) for the recovery after `before` recoveries of
// the job's status to start and for every node's ranks to complete a step
// after `since` (MonoNs) in its epoch; returns the last of those steps
// (MonoNs; 0: not by the deadline), and that recovery's record in *rec.
int64_t WaitFirstSteps(const Job& j, size_t before, int64_t since, std::chrono::steady_clock::time_point deadline,
                       nlohmann::json* rec);

}  // namespace ftrun::bench
