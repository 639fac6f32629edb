// Scenario "erasure", its cluster half: the same job (6 local nodes x 2
// ranks, a spare) run twice in one run, with `cluster.redundancy: {erasure:
// {data: 4, parity: 2}}` and with `cluster.replicas: 2` (both survive any
// two lost nodes). In each a whole node is SIGKILLed once versions commit,
// and the time from the kill until every rank completed a step after the
// restore is taken: erasure's over the replicas' is rebuild_over_replicas.
// From the erasure run's agents, while it runs: the parity each node holds
// for the committed version over its own state (memory_over_state), and the
// bytes a version with 10% of the chunks changed sends, over what a version
// from zeros sends (incremental_wire_ratio, from a third run whose steps are
// slower than its commit rounds, so that each version changed 10%).
#include "bench/erasure_cluster.h"

#include <signal.h>
#include <sys/wait.h>

#include <map>
#include <optional>
#include <thread>

#include "bench/bench_util.h"
#include "bench/cluster_job.h"

namespace ftrun::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Run {
  bool ok = false;
  std::string error;
  double recovery_s = 0;       // kill to every rank's first step after the restore
  std::vector<double> memory;  // per node: 1 + parity held / own state (erasure)
  int early_recoveries = 0;    // before the kill (a node unheard for 10 s under load)
  std::string log;
};

std::string Config(const std::string& redundancy, const ErasureClusterParams& p) {
  // 10 s of silence before a node is lost: a 2-core machine running 6
  // agents and 12 ranks can leave an agent unheard for seconds while the
  // first version's parity (or copies) crosses.
  return "job:\n  max_restarts: 3\n  stop_grace: 2s\n"
         "store:\n  memory_budget: " +
         p.budget + "\n  chunk_size: 1MiB\n  prefault: false\n" + "cluster:\n  " + redundancy +
         "\n  heartbeat_interval: 200ms\n  heartbeat_misses: 50\n";
}

// The contributions of a job whose every version changes 10% of the
// chunks since the last (steps slower than a commit round: each round's
// base is the version before), as its agents report them.
std::vector<double> WireRatios(const std::string& code, const ErasureClusterParams& p, std::vector<double>* changed,
                               std::string* log) {
  Job j = StartJob(
      "erasure-wire", 6, 2, 0, Config(code, p),
      {"--state-bytes", p.state, "--tensors", "8", "--steps", "8", "--step-ms", "2000", "--change-fraction", "0.1"});
  *log = j.dir + "/out.log";
  std::map<std::pair<int, uint64_t>, nlohmann::json> seen;  // (node, version) -> contribution
  nlohmann::json st;
  while (::waitpid(j.runner, nullptr, WNOHANG) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (!ReadJson(j.status, &st) || !st.contains("nodes")) continue;
    for (int n = 0; n < 6; ++n) {
      nlohmann::json a;
      if (st["nodes"][static_cast<size_t>(n)]["agent"].is_null() ||
          !AgentStatus(st, st["nodes"][static_cast<size_t>(n)]["agent"], &a) || !a.contains("erasure"))
        continue;
      for (const auto& c : a["erasure"]["contributions"]) seen[{n, c["version"].get<uint64_t>()}] = c;
    }
  }
  std::vector<double> ratios;
  for (const auto& [key, c] : seen) {
    const double shard = c["shard_bytes"].get<double>();
    if (c["from_zeros"].get<bool>() || c["full_holders"].get<int>() > 0 || shard <= 0) continue;
    ratios.push_back(c["bytes_sent"].get<double>() / (shard * p.parity));
    changed->push_back(c["changed_bytes"].get<double>() / shard);
  }
  return ratios;
}

Run RunJob(const std::string& name, const std::string& redundancy, const ErasureClusterParams& p) {
  Job j = StartJob(name, 6, 2, 1, Config(redundancy, p),
                   {"--state-bytes", p.state, "--tensors", "8", "--steps", "1000000", "--step-ms",
                    std::to_string(p.step_ms), "--change-fraction", "0.1"});
  Run r;
  r.log = j.dir + "/out.log";
  auto deadline = Clock::now() + std::chrono::minutes(6);
  nlohmann::json st;
  std::optional<uint64_t> first;
  while (Clock::now() < deadline && ::waitpid(j.runner, nullptr, WNOHANG) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (!ReadJson(j.status, &st) || st["phase"] != "running" || st["committed_version"].is_null()) continue;
    const uint64_t c = st["committed_version"];
    if (!first) first = c;
    if (c >= *first + 4) break;  // a few rounds after the first: deltas, pages warm
  }
  if (!first) {
    r.error = "no version committed";
    ::kill(j.runner, SIGTERM);
    WaitExit(j.runner);
    return r;
  }
  for (int n = 0; n < 6; ++n) {  // what each node holds and sends
    nlohmann::json a;
    if (st["nodes"][static_cast<size_t>(n)]["agent"].is_null() ||
        !AgentStatus(st, st["nodes"][static_cast<size_t>(n)]["agent"], &a) || !a.contains("erasure"))
      continue;
    const auto& e = a["erasure"];
    double own = 0;
    for (const auto& c : e["contributions"]) own = c["shard_bytes"].get<double>();
    if (own > 0) r.memory.push_back(1.0 + e["parity_bytes"].get<double>() / own);
  }
  // (A recovery before the kill, a node unheard under load, is not this one.)
  const size_t before = st["recoveries"].size();
  r.early_recoveries = static_cast<int>(before) - 1;
  const int64_t killed = KillNode(st, 1);
  nlohmann::json rec;
  const int64_t last_step = WaitFirstSteps(j, before, killed, deadline, &rec);
  ::kill(j.runner, SIGTERM);
  WaitExit(j.runner);
  if (last_step == 0) {
    r.error = "no recovery completed";
    return r;
  }
  r.recovery_s = static_cast<double>(last_step - killed) / 1e9;
  r.ok = true;
  return r;
}

}  // namespace

int RunErasureCluster(const ErasureClusterParams& p, Result* out) {
  UseTcpOnLoopback();
  const std::string code =
      "redundancy: {erasure: {data: " + std::to_string(p.data) + ", parity: " + std::to_string(p.parity) + "}}";
  std::vector<double> changed;
  std::string wire_log;
  const std::vector<double> wire_ratios = WireRatios(code, p, &changed, &wire_log);
  Run ec = RunJob("erasure-ec", code, p);
  Run rep = RunJob("erasure-replicas", "replicas: " + std::to_string(p.parity), p);
  for (const Run* r : {&ec, &rep}) {
    if (!r->ok) {
      std::fprintf(stderr, "ftrun-bench erasure: %s (see %s)\n", r->error.c_str(), r->log.c_str());
      return 1;
    }
  }
  if (ec.memory.empty() || wire_ratios.empty()) {
    std::fprintf(stderr, "ftrun-bench erasure: the agents reported no parity (see %s, %s)\n", ec.log.c_str(),
                 wire_log.c_str());
    return 1;
  }
  const double mem = *std::max_element(ec.memory.begin(), ec.memory.end());
  const double mem_target = 1.0 + static_cast<double>(p.parity) / p.data + 0.05;
  out->figures.push_back({"memory_over_state", mem, "x (the fullest node)",
                          "<= " + std::to_string(mem_target).substr(0, 4), mem <= mem_target});
  const double wire = Median(wire_ratios);
  out->figures.push_back({"incremental_wire_ratio", wire, "x a version from zeros", "<= 0.11", wire <= 0.11});
  out->figures.push_back({"  changed_fraction (the same versions)", Median(changed), "of the shard", "", true});
  const double ratio = ec.recovery_s / rep.recovery_s;
  out->figures.push_back({"rebuild_over_replicas", ratio, "x", "<= 1.5", ratio <= 1.5});
  out->figures.push_back({"  rebuild_s (erasure)", ec.recovery_s, "s", "", true});
  out->figures.push_back({"  rebuild_s (replicas " + std::to_string(p.parity) + ")", rep.recovery_s, "s", "", true});
  out->details["cluster"] = {{"nodes", 6},
                             {"recoveries_before_the_kill", {ec.early_recoveries, rep.early_recoveries}},
                             {"ranks_per_node", 2},
                             {"state_per_rank", p.state},
                             {"memory_over_state_per_node", ec.memory},
                             {"wire_ratios", wire_ratios},
                             {"wire_changed_fractions", changed},
                             {"wire_log", wire_log},
                             {"erasure_log", ec.log},
                             {"replicas_log", rep.log},
                             {"transport", "UCX_TLS=tcp,self UCX_NET_DEVICES=lo"}};
  return 0;
}

}  // namespace ftrun::bench
