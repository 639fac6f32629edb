// What a rank process is started with: its command line (DeepSpeed launch
// rules: python -u [-m] SCRIPT --local_rank=N ARGS) and its environment
// (DeepSpeed's and torchrun's variables, plus ftrun's own).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "launcher/agent/options.h"

namespace ftrun {

struct RankIdentity {
  int local_rank = 0;
  int global_rank = 0;
  int restart_count = 0;  // generation: 0 on the first start
  std::string socket_path;
};

std::vector<std::string> BuildRankCommand(const AgentOptions& o, int local_rank);

// The agent's own environment with the rank's variables set over it, and
// the Python package built or installed with this agent appended to
// PYTHONPATH (launcher/common/install_paths.h).
// Where the runner hosts the job's rendezvous store (options.h:
// rendezvous_store), every rank connects to it with torchrun's
// TORCHELASTIC_USE_AGENT_STORE=True, and torch puts each generation's keys
// under its TORCHELASTIC_RESTART_COUNT; else rank 0 hosts it, and
// MASTER_PORT moves with the restart count, so a new generation never joins
// a rendezvous the dead one may still hold.
std::vector<std::string> BuildRankEnv(const AgentOptions& o, const RankIdentity& id);

// The variables BuildRankEnv sets for a rank (what a warm survivor or
// standby is given for a new generation: warm_ranks.h).
std::map<std::string, std::string> RankVariables(const AgentOptions& o, const RankIdentity& id);

// Non-empty where BuildRankEnv and BuildStandbyEnv set OMP_NUM_THREADS=1, as
// torchrun does: more than one rank on this node and no OMP_NUM_THREADS in
// the agent's environment. What the agent logs once, at its start.
std::string ThreadsNotice(const AgentOptions& o);

// A warm standby's environment: the agent's, with the node's variables and
// FTRUN_WARM_STANDBY=1, but no rank's (it gets them when given a rank).
std::vector<std::string> BuildStandbyEnv(const AgentOptions& o, const std::string& socket_path);

}  // namespace ftrun
