#include "launcher/agent/rank_env.h"

#include <cstdlib>
#include <map>

#include "launcher/common/install_paths.h"

namespace ftrun {

std::vector<std::string> BuildRankCommand(const AgentOptions& o, int local_rank) {
  std::vector<std::string> cmd;
  if (!o.no_python) {
    cmd.push_back(PythonInterpreter());
    cmd.push_back("-u");
    if (o.module) cmd.push_back("-m");
  }
  // DeepSpeed's launch.py order: the script, then --local_rank=N, then the
  // script's own arguments (scripts that parse positionals or REMAINDER see
  // the same argv under ftrun as under deepspeed).
  auto script_end = o.command.begin() + (o.command.empty() ? 0 : 1);
  cmd.insert(cmd.end(), o.command.begin(), script_end);
  if (!o.no_local_rank) cmd.push_back("--local_rank=" + std::to_string(local_rank));
  cmd.insert(cmd.end(), script_end, o.command.end());
  return cmd;
}

namespace {

// torchrun's rule: with more than one rank on a node and no OMP_NUM_THREADS
// in the agent's environment, each rank gets OMP_NUM_THREADS=1 (torch's
// intra-op pool is otherwise as wide as the node, in every rank at once).
bool OneThreadPerRank(const AgentOptions& o) { return o.local_ranks > 1 && std::getenv("OMP_NUM_THREADS") == nullptr; }

void LimitThreads(const AgentOptions& o, std::map<std::string, std::string>& env) {
  if (OneThreadPerRank(o)) env["OMP_NUM_THREADS"] = "1";
}

std::string Devices(const AgentOptions& o) {
  std::string devices;
  for (size_t i = 0; i < o.slots.size(); ++i) devices += (i ? "," : "") + std::to_string(o.slots[i]);
  return devices;
}

}  // namespace

std::string ThreadsNotice(const AgentOptions& o) {
  if (!OneThreadPerRank(o)) return "";
  return "OMP_NUM_THREADS=1 in each rank's environment (" + std::to_string(o.local_ranks) +
         " ranks on this node; as torchrun: set OMP_NUM_THREADS to choose another)";
}

std::map<std::string, std::string> RankVariables(const AgentOptions& o, const RankIdentity& id) {
  const std::string world = std::to_string(o.world_size);
  const std::string local = std::to_string(o.local_ranks);
  // The runner's store when it hosts one (torchrun's agent store: every
  // rank a client, at a server of the generation's own: rendezvous_keeper.h),
  // else rank 0's on a port of the generation's own.
  const size_t colon = o.rendezvous_store.rfind(':');
  const bool agent_store = !o.rendezvous_store.empty() && colon != std::string::npos;
  return {
      // DeepSpeed
      {"RANK", std::to_string(id.global_rank)},
      {"LOCAL_RANK", std::to_string(id.local_rank)},
      {"WORLD_SIZE", world},
      {"LOCAL_SIZE", local},
      {"CROSS_RANK", std::to_string(o.node_rank)},
      {"CROSS_SIZE", std::to_string(o.num_nodes)},
      {"MASTER_ADDR", agent_store ? o.rendezvous_store.substr(0, colon) : o.master_addr},
      {"MASTER_PORT",
       agent_store ? o.rendezvous_store.substr(colon + 1) : std::to_string(o.master_port + id.restart_count)},
      {"TORCHELASTIC_USE_AGENT_STORE", agent_store ? "True" : "False"},
      {"CUDA_VISIBLE_DEVICES", Devices(o)},
      // torchrun
      {"LOCAL_WORLD_SIZE", local},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(o.num_nodes)},
      {"ROLE_RANK", std::to_string(id.global_rank)},
      {"ROLE_NAME", "default"},
      {"ROLE_WORLD_SIZE", world},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(id.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.config.job.max_restarts)},
      {"TORCHELASTIC_RUN_ID", o.job_id},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"PYTHONUNBUFFERED", "1"},
      // ftrun
      {"FTRUN_AGENT_SOCKET", id.socket_path},
      {"FTRUN_RANK", std::to_string(id.global_rank)},
      {"FTRUN_JOB_ID", o.job_id},
      {"FTRUN_NODE_RANK", std::to_string(o.node_rank)},
  };
}

std::vector<std::string> BuildRankEnv(const AgentOptions& o, const RankIdentity& id) {
  std::map<std::string, std::string> env = ProcessEnvironment();
  for (const auto& [k, v] : RankVariables(o, id)) env[k] = v;
  LimitThreads(o, env);
  return WithOwnPythonPackage(std::move(env));
}

std::vector<std::string> BuildStandbyEnv(const AgentOptions& o, const std::string& socket_path) {
  std::map<std::string, std::string> env = ProcessEnvironment();
  // Nothing that names a rank or a rendezvous: a standby joins no
  // generation before it is given a rank.
  for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FTRUN_RANK", "ROLE_RANK",
                        "GROUP_RANK", "CROSS_RANK", "TORCHELASTIC_RESTART_COUNT"}) {
    env.erase(k);
  }
  env["CUDA_VISIBLE_DEVICES"] = Devices(o);
  env["PYTHONUNBUFFERED"] = "1";
  env["FTRUN_AGENT_SOCKET"] = socket_path;
  env["FTRUN_JOB_ID"] = o.job_id;
  env["FTRUN_NODE_RANK"] = std::to_string(o.node_rank);
  env["FTRUN_WARM_STANDBY"] = "1";
  LimitThreads(o, env);
  return WithOwnPythonPackage(std::move(env));
}

}  // namespace ftrun
