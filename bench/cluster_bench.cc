// Multi-node scenarios, run with the `ftrun` runner's local launcher (every
// node an agent on this machine, UCX over tcp on loopback):
//
// "replicate": one node's copies to its holder, against ucx_perftest on the
// same transport and address in the same run (throughput_over_ucx_perftest),
// and the bytes on the wire when 10% of the chunks changed, over the state
// size (incremental_wire_ratio).
//
// "restart-node": 4 nodes x 2 ranks and a spare; SIGKILL a whole node once a
// version is committed, and time from the kill to the first step completed
// after the restore on every rank, with the breakdown.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "bench/bench_util.h"
#include "bench/cluster_job.h"
#include "plugin/config/units.h"

namespace ftrun::bench {
namespace {

using Clock = std::chrono::steady_clock;

// ucx_perftest tag_bw between two processes on 127.0.0.1, `size`-byte
// messages; returns bytes per second (overall), 0 on failure.
double UcxPerftest(uint64_t size, int iters, const std::string& log) {
  const std::string exe = "/usr/bin/ucx_perftest";
  const std::string port = std::to_string(20000 + ::getpid() % 20000);
  std::vector<std::string> common = {"-t", "tag_bw", "-s", std::to_string(size), "-n", std::to_string(iters), "-w",
                                     "2",  "-p",     port};
  pid_t server = StartProgram(exe, common, log + ".server");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::vector<std::string> client = {"127.0.0.1"};
  client.insert(client.end(), common.begin(), common.end());
  client.push_back("-f");
  pid_t c = StartProgram(exe, client, log);
  WaitExit(c);
  WaitExit(server);
  std::ifstream f(log);
  std::string line, last;
  while (std::getline(f, line)) {
    if (line.find_first_not_of(" 0123456789.") == std::string::npos && !line.empty()) last = line;
  }
  std::istringstream in(last);
  double v[8] = {};
  for (double& x : v) in >> x;
  return v[5] * 1024.0 * 1024.0;  // "bandwidth (MB/s) overall", MB = 2^20
}

}  // namespace

int RunReplicate(int argc, char** argv, Result* out) {
  CLI::App app{"ftrun-bench replicate: replication throughput and incremental bytes on the wire"};
  std::string state = "256MiB";
  int steps = 12;
  app.add_option("--state", state, "state of the node's one rank");
  app.add_option("--steps", steps, "saves in the full-change run (the first three are not counted)");
  CLI11_PARSE(app, argc, argv);
  UseTcpOnLoopback();
  const std::string cfg =
      "store:\n  memory_budget: 2GiB\n  chunk_size: 4MiB\n  prefault: true\n"
      "cluster:\n  replicas: 1\n  heartbeat_interval: 200ms\n  heartbeat_misses: 10\n";
  uint64_t state_bytes = 0;
  if (!ParseSize(state, &state_bytes).ok() || state_bytes < (4u << 20)) {
    std::fprintf(stderr, "ftrun-bench replicate: --state '%s' must be a size of at least 4MiB\n", state.c_str());
    return 2;
  }
  // The ceiling moves messages the size of the state: like a copy, each one
  // streams from and into memory. With chunk-sized messages ucx_perftest
  // sends one 4 MiB buffer over and over from the CPU cache, which no copy
  // of a state larger than the cache can do.
  auto perftest = [&] { return UcxPerftest(state_bytes, 8, "/tmp/ftrun-bench-perftest.log"); };
  std::vector<double> perf = {perftest(), perftest()};

  // Every chunk of rank 0 changes at every step: each of node 0's copies is
  // the whole state. Rank 1 (node 1) keeps its state, so its copies to node
  // 0 are manifests only and the figure is one agent's one-way throughput,
  // as ucx_perftest's is.
  nlohmann::json runner_last;  // the last run's runner status: its commit figures
  auto run = [&](const std::string& name, const std::string& fraction, int n, const std::string& chunk) {
    std::string c = cfg;
    c.replace(c.find("4MiB"), 4, chunk);
    Job j = StartJob(name, 2, 1, 0, c,
                     {"--state-bytes", state, "--tensors", "8", "--steps", std::to_string(n), "--step-ms", "1500",
                      "--change-fraction", fraction, "--change-only-rank", "0", "--use-generations"});
    nlohmann::json st, agent, last;
    while (::waitpid(j.runner, nullptr, WNOHANG) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (ReadJson(j.status, &st) && AgentStatus(st, 0, &agent)) {
        last = agent;
        runner_last = st;
      }
    }
    return last.contains("replication") ? last["replication"] : nlohmann::json::array();
  };
  nlohmann::json full = run("replicate-full", "1.0", steps, "4MiB");
  perf.push_back(perftest());  // before and after: the machine's load drifts
  const double ceiling = Median(perf);
  // The trainer changes 1 MiB blocks: with 1 MiB chunks, 10% of the chunks.
  nlohmann::json incr = run("replicate-incr", "0.1", 6, "1MiB");
  std::vector<double> rates, ratios;
  for (const auto& r : full) {
    if (r["version"].get<uint64_t>() >= 3 && r["seconds"].get<double>() > 0) {
      rates.push_back(r["bytes_sent"].get<double>() / r["seconds"].get<double>());
    }
  }
  for (const auto& r : incr) {
    if (r["version"].get<uint64_t>() >= 1)
      ratios.push_back(r["bytes_sent"].get<double>() / r["state_bytes"].get<double>());
  }
  if (rates.empty() || ratios.empty() || ceiling <= 0) {
    std::fprintf(stderr, "ftrun-bench replicate: no measurement (copies %zu/%zu, perftest %.0f B/s)\n", rates.size(),
                 ratios.size(), ceiling);
    return 1;
  }
  double rate = Median(rates), ratio = Median(ratios);
  out->figures.push_back({"throughput_over_ucx_perftest", rate / ceiling, "ratio", ">= 0.9", rate / ceiling >= 0.9});
  out->figures.push_back({"  replication", rate / 1e9, "GB/s", "", true});
  out->figures.push_back({"  ucx_perftest tag_bw, state-sized messages", ceiling / 1e9, "GB/s", "", true});
  out->figures.push_back({"incremental_wire_ratio", ratio, "ratio", "<= 0.11", ratio <= 0.11});
  // How the commits went: the held reports each took (messages to the
  // coordinator), and the last one's lag after the last rank's save (the
  // round trip that names the version, then the copy).
  const double commits = runner_last.value("commits", 0.0);
  if (commits > 0) {
    out->figures.push_back({"  held reports per commit (2 nodes, incremental run)",
                            runner_last.value("held_reports", 0.0) / commits, "messages", "", true});
  }
  if (runner_last.contains("last_commit_lag_ms") && runner_last["last_commit_lag_ms"].is_number()) {
    out->figures.push_back({"  commit lag, last rank's save to commit (incremental run)",
                            runner_last["last_commit_lag_ms"].get<double>(), "ms", "", true});
  }
  out->details = {{"state", state},
                  {"perftest_bytes_per_s", perf},
                  {"full_copies", full},
                  {"incremental_copies", incr},
                  {"transport", "UCX_TLS=tcp,self UCX_NET_DEVICES=lo"}};
  return 0;
}

int RunRestartNode(int argc, char** argv, Result* out) {
  CLI::App app{"ftrun-bench restart-node: kill a whole node, time the recovery"};
  std::string state = "256MiB";
  app.add_option("--state", state, "state per rank (4 nodes x 2 ranks)");
  CLI11_PARSE(app, argc, argv);
  UseTcpOnLoopback();
  const std::string cfg =
      "job:\n  max_restarts: 3\n  stop_grace: 2s\n"
      "store:\n  memory_budget: 2560MiB\n  chunk_size: 4MiB\n  prefault: true\n"
      "cluster:\n  replicas: 1\n  heartbeat_interval: 200ms\n  heartbeat_misses: 25\n";
  Job j = StartJob(
      "restart-node", 4, 2, 1, cfg,
      {"--state-bytes", state, "--tensors", "8", "--steps", "1000000", "--step-ms", "500", "--change-fraction", "0.1"});
  auto deadline = Clock::now() + std::chrono::minutes(4);
  nlohmann::json st;
  // Two commit rounds after the first: every shard has a copy, pages warm.
  std::optional<uint64_t> first;
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!ReadJson(j.status, &st) || st["phase"] != "running" || st["committed_version"].is_null()) continue;
    uint64_t c = st["committed_version"];
    if (!first)
      first = c;
    else if (c >= *first + 4)
      break;
  }
  const int64_t killed_ns = KillNode(st, 1);
  // Wait until every node's ranks completed a step after the restore.
  nlohmann::json rec;
  const int64_t last_step = WaitFirstSteps(j, 1, killed_ns, deadline, &rec);
  ::kill(j.runner, SIGTERM);
  WaitExit(j.runner);
  if (last_step == 0) {
    std::fprintf(stderr, "ftrun-bench restart-node: no recovery completed; see %s/out.log\n", j.dir.c_str());
    return 1;
  }
  double total = (last_step - killed_ns) / 1e9;
  double detect = (rec["detected_mono_ns"].get<int64_t>() - killed_ns) / 1e6;
  double rebuild = (rec["started_mono_ns"].get<int64_t>() - rec["detected_mono_ns"].get<int64_t>()) / 1e6;
  double restart = (last_step - rec["started_mono_ns"].get<int64_t>()) / 1e6;
  out->figures.push_back({"recovery_s", total, "s", "<= 2", total <= 2.0});
  out->figures.push_back({"  detect_ms", detect, "ms", "", true});
  out->figures.push_back({"  halt_and_rebuild_ms", rebuild, "ms", "", true});
  out->figures.push_back({"  respawn_restore_first_step_ms", restart, "ms", "", true});
  out->details = {{"state_per_rank", state},
                  {"nodes", 4},
                  {"ranks_per_node", 2},
                  {"coordinator_recovery", rec},
                  {"log", j.dir + "/out.log"}};
  return 0;
}

}  // namespace ftrun::bench
