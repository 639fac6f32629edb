#include "bench/cluster_job.h"

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "bench/bench_util.h"

namespace ftrun::bench {

Job StartJob(const std::string& name, int nodes, int per_node, int spares, const std::string& config,
             const std::vector<std::string>& trainer) {
  Job j;
  j.dir = "/tmp/ftrun-bench-" + name + "-" + std::to_string(::getpid());
  ::mkdir(j.dir.c_str(), 0700);
  j.status = j.dir + "/status.json";
  std::ofstream(j.dir + "/ftrun.yaml") << config << "agent:\n  run_dir: " << j.dir << "/run\n";
  std::vector<std::string> args = {"--num_nodes",
                                   std::to_string(nodes),
                                   "--num_gpus",
                                   std::to_string(per_node),
                                   "--spares",
                                   std::to_string(spares),
                                   "--config",
                                   j.dir + "/ftrun.yaml",
                                   "--status_file",
                                   j.status,
                                   "--no_python",
                                   "--no_local_rank",
                                   SiblingBinary("ftrun-synthetic")};
  args.insert(args.end(), trainer.begin(), trainer.end());
  j.runner = StartProgram(SiblingBinary("ftrun"), args, j.dir + "/out.log");
  return j;
}

bool AgentStatus(const nlohmann::json& runner, int agent, nlohmann::json* out) {
  if (!runner.contains("agents") || agent >= static_cast<int>(runner["agents"].size())) return false;
  return ReadJson(runner["agents"][static_cast<size_t>(agent)]["status_file"].get<std::string>(), out);
}

int64_t KillNode(const nlohmann::json& st, int node) {
  if (st["nodes"][static_cast<size_t>(node)]["agent"].is_null()) return 0;
  const int agent = st["nodes"][static_cast<size_t>(node)]["agent"];
  nlohmann::json victim;
  AgentStatus(st, agent, &victim);
  std::vector<pid_t> pids = {st["agents"][static_cast<size_t>(agent)]["pid"].get<pid_t>()};
  if (victim.contains("ranks")) {
    for (const auto& r : victim["ranks"]) pids.push_back(r["pid"].get<pid_t>());
  }
  const int64_t killed = MonoNs();
  for (pid_t p : pids) {
    if (p > 0) ::kill(p, SIGKILL);  // never 0: that is our own process group
  }
  return killed;
}

int64_t WaitFirstSteps(const Job& j, size_t before, int64_t since, std::chrono::steady_clock::time_point deadline,
                       nlohmann::json* rec) {
  nlohmann::json st;
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!ReadJson(j.status, &st) || st["recoveries"].size() <= before ||
        !st["recoveries"][before].contains("started_mono_ns"))
      continue;
    *rec = st["recoveries"][before];
    int64_t last_step = 0;
    for (const auto& n : st["nodes"]) {
      nlohmann::json a;
      if (n["agent"].is_null() || !AgentStatus(st, n["agent"], &a) || a["recoveries"].empty() ||
          !a["recoveries"].back().contains("first_step_mono_ns") || a["epoch"] != st["epoch"] ||
          a["recoveries"].back()["first_step_mono_ns"].get<int64_t>() < since) {
        last_step = 0;
        break;
      }
      last_step = std::max<int64_t>(last_step, a["recoveries"].back()["first_step_mono_ns"]);
    }
    if (last_step != 0) return last_step;
  }
  return 0;
}

}  // namespace ftrun::bench
