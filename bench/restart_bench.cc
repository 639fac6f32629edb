// Scenario "restart-local": 4 ranks of the synthetic trainer under one
// agent; SIGKILL one rank once a version is committed, and time from the
// kill to the first step completed after the restore on every rank, with
// the agent's breakdown (stop, respawn, connect, restore, first step).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <thread>

#include "bench/bench_util.h"

namespace ftrun::bench {

int RunRestartLocal(int argc, char** argv, Result* out) {
  CLI::App app{"ftrun-bench restart-local: kill a rank, time the recovery"};
  int ranks = 4, kills = 3;
  std::string state = "256MiB";
  app.add_option("--ranks", ranks, "ranks on the node");
  app.add_option("--state", state, "state per rank");
  app.add_option("--kills", kills, "kills (one recovery each; the median is reported)");
  CLI11_PARSE(app, argc, argv);

  const std::string dir = "/tmp/ftrun-bench-" + std::to_string(::getpid());
  const std::string cfg = dir + ".yaml", status = dir + ".status.json";
  std::ofstream(cfg) << "job:\n  max_restarts: " << kills + 1 << "\n  hang_timeout: 60s\n  stop_grace: 2s\n"
                     << "store:\n  memory_budget: " << ranks << "GiB\n"
                     << "agent:\n  run_dir: " << dir << "\n  log_level: info\n";
  pid_t agent = StartAgent({"--config",
                            cfg,
                            "--nproc",
                            std::to_string(ranks),
                            "--job-id",
                            "bench-restart",
                            "--status-file",
                            status,
                            "--no_python",
                            "--no_local_rank",
                            SiblingBinary("ftrun-synthetic"),
                            "--state-bytes",
                            state,
                            "--tensors",
                            "8",
                            "--steps",
                            "1000000",
                            "--step-ms",
                            "10",
                            "--change-fraction",
                            "0.1"});
  std::vector<double> totals;
  nlohmann::json recoveries = nlohmann::json::array();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  for (int k = 0; k < kills && std::chrono::steady_clock::now() < deadline; ++k) {
    nlohmann::json j;
    // Wait for a committed version in this generation, all ranks running.
    while (std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!ReadJson(status, &j) || j["restarts"] != k || j["state"] != "running") continue;
      if (k > 0 && !j["recoveries"][k - 1].contains("total_ms")) continue;
      if (!j["committed_version"].is_null() && j["store"]["prefaulted"] == true) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a few steps past the commit
    if (!ReadJson(status, &j)) break;
    pid_t victim = j["ranks"][std::min<size_t>(1, j["ranks"].size() - 1)]["pid"];
    int64_t killed_ns = MonoNs();
    ::kill(victim, SIGKILL);
    while (std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (ReadJson(status, &j) && j["recoveries"].size() > static_cast<size_t>(k) &&
          j["recoveries"][k].contains("first_step_mono_ns"))
        break;
    }
    nlohmann::json r = j["recoveries"][k];
    if (!r.contains("first_step_mono_ns")) break;
    double total = (r["first_step_mono_ns"].get<int64_t>() - killed_ns) / 1e9;
    r["detect_ms"] = (r["detected_mono_ns"].get<int64_t>() - killed_ns) / 1e6;
    r["recovery_s"] = total;
    recoveries.push_back(r);
    totals.push_back(total);
  }
  ::kill(agent, SIGTERM);
  WaitExit(agent);
  ::unlink(cfg.c_str());
  ::unlink(status.c_str());
  if (totals.empty()) {
    std::fprintf(stderr, "ftrun-bench restart-local: no recovery completed\n");
    return 1;
  }
  double med = Median(totals);
  out->figures.push_back({"recovery_s", med, "s", "<= 1", med <= 1.0});
  const nlohmann::json* mid = &recoveries[0];
  for (const auto& r : recoveries) {
    if (r["recovery_s"].get<double>() == med) mid = &r;
  }
  for (const char* part : {"detect_ms", "stop_ms", "respawn_ms", "connect_ms", "restore_ms", "first_step_ms"}) {
    out->figures.push_back({std::string("  ") + part, (*mid)[part].get<double>(), "ms", "", true});
  }
  out->details = {{"ranks", ranks}, {"state_per_rank", state}, {"recoveries", recoveries}};
  return 0;
}

}  // namespace ftrun::bench
