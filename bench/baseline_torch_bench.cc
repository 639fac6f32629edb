// Scenario "baseline-torch": integration/examples/train_gpt.py (2 nodes x 2
// ranks, each rank's model plus Adam shard >= 256 MiB) with the status quo -
// every rank torch.saves its state to local disk (fsync'd), and after a
// SIGKILL the whole job is relaunched and torch.loads it - against the same
// job under ftrun, in the same run. bench/baseline_torch.py does the process
// work (spawning, killing, reading the ranks' TIMING lines and the agents'
// status files) and writes its figures as JSON; this file reports them:
//
//   save_speedup      median stall per save, torch.save + fsync over ftrun.save
//   restore_speedup   slowest rank's time to put the state back into model,
//                     optimizer and generators after the restart, torch over ftrun
//   recovery_speedup  kill -> every rank's first step after the restore, torch
//                     over ftrun (reported; Python start-up, import torch, the
//                     process group and the first step weigh on both sides)
//   warm_recovery_speedup  the same, torch over ftrun's warm recovery (the script
//                     under @ftrun.resilient: survivors stay, a warm standby
//                     takes the victim's place)
//   warm_restore_speedup   torch's restore over a survivor's in-place ftrun.restore
//   survivor_ready_s  kill -> the survivors restored and ready to step
//   warm_ready_speedup  kill -> every rank ready to step, torch over ftrun warm
//                     (reported: the first step, which both take alike, left out)
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "bench/bench_util.h"
#include "launcher/common/install_paths.h"

namespace ftrun::bench {
namespace {

double Num(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

}  // namespace

int RunBaselineTorch(int argc, char** argv, Result* out) {
  CLI::App app{"ftrun-bench baseline-torch: torch.save/torch.load and a relaunch vs ftrun, same model, same run"};
  std::string python = PythonInterpreter();  // the agent's rule: FTRUN_PYTHON, else python3
  std::string driver = BenchScript("baseline_torch.py", __FILE__);
  int nodes = 2, per_node = 2, kills = 3, saves = 4, replicas = 1, layers = 4, d_model = 1024;
  bool keep = false;
  app.add_option("--python", python, "the interpreter of the driver and the ranks (needs torch)");
  app.add_option("--driver", driver, "bench/baseline_torch.py");
  app.add_option("--nodes", nodes, "nodes (the status quo: ranks spawned as torchrun would)");
  app.add_option("--per-node", per_node, "ranks per node");
  app.add_option("--kills", kills, "kills per side (the medians are reported)");
  app.add_option("--saves", saves, "saves per rank before each kill and at the end");
  app.add_option("--replicas", replicas, "ftrun's cluster.replicas");
  app.add_option("--layers", layers, "transformer blocks of train_gpt.py");
  app.add_option("--d-model", d_model, "model width of train_gpt.py");
  app.add_flag("--keep", keep, "keep the logs under /tmp");
  CLI11_PARSE(app, argc, argv);
  if (!PathExists(driver)) {
    std::fprintf(stderr, "ftrun-bench baseline-torch: no driver at %s (pass --driver)\n", driver.c_str());
    return 2;
  }
  const std::string json_path = "/tmp/ftrun-bench-baseline-" + std::to_string(::getpid()) + ".json";
  std::vector<std::string> args = {driver,
                                   "--build",
                                   DirOf(SiblingBinary("ftrun-bench")),
                                   "--python",
                                   python,
                                   "--nodes",
                                   std::to_string(nodes),
                                   "--per-node",
                                   std::to_string(per_node),
                                   "--kills",
                                   std::to_string(kills),
                                   "--saves",
                                   std::to_string(saves),
                                   "--replicas",
                                   std::to_string(replicas),
                                   "--layers",
                                   std::to_string(layers),
                                   "--d-model",
                                   std::to_string(d_model),
                                   "--out",
                                   json_path};
  if (keep) args.push_back("--keep");
  int rc = WaitExit(StartProgram(python, args, ""));  // progress goes to our stderr
  nlohmann::json j;
  bool have = ReadJson(json_path, &j);
  ::unlink(json_path.c_str());
  if (!have || rc != 0 || !j.value("ok", false)) {
    std::fprintf(stderr, "ftrun-bench baseline-torch: the driver failed (exit %d): %s\n", rc,
                 have ? j.value("error", std::string("?")).c_str() : "no result");
    return 1;
  }
  const nlohmann::json& t = j["torch"]["summary"];
  const nlohmann::json& f = j["ftrun"]["summary"];
  const double save = j["save_speedup"], restore = j["restore_speedup"], recovery = j["recovery_speedup"];
  auto& figs = out->figures;
  figs.push_back({"save_speedup", save, "ratio", ">= 10", save >= 10});
  figs.push_back({"  torch.save + fsync stall", Num(t, "save_stall_s"), "s", "", true});
  figs.push_back({"    torch.save (to the page cache)", Num(t, "save_write_s"), "s", "", true});
  figs.push_back({"    fsync + rename", Num(t, "save_fsync_s"), "s", "", true});
  figs.push_back({"  ftrun.save stall", Num(f, "save_stall_s"), "s", "", true});
  figs.push_back({"restore_speedup", restore, "ratio", ">= 10", restore >= 10});
  figs.push_back({"  torch: load + put back", Num(t, "restore_s"), "s", "", true});
  figs.push_back({"    torch.load", Num(t, "restore_load_s"), "s", "", true});
  figs.push_back({"  ftrun: load + put back", Num(f, "restore_s"), "s", "", true});
  figs.push_back({"    ftrun.load", Num(f, "restore_load_s"), "s", "", true});
  figs.push_back({"recovery_speedup", recovery, "ratio", "", true});
  for (const auto& [side, s] : {std::pair<std::string, const nlohmann::json*>{"torch", &t}, {"ftrun", &f}}) {
    figs.push_back({"  " + side + ": kill -> first step", Num(*s, "recovery_s"), "s", "", true});
    figs.push_back({"    kill -> every rank respawned", Num(*s, "segment_kill_to_spawned_s"), "s", "", true});
    figs.push_back({"    Python start-up + import torch", Num(*s, "segment_startup_and_import_s"), "s", "", true});
    figs.push_back({"    (share of kill -> first step)", Num(*s, "startup_and_import_share"), "ratio", "", true});
    figs.push_back({"    process group, model, optimizer", Num(*s, "segment_setup_s"), "s", "", true});
    figs.push_back({"    restore", Num(*s, "segment_restore_s"), "s", "", true});
    figs.push_back({"    first step", Num(*s, "segment_first_step_s"), "s", "", true});
  }
  for (const char* part : {"detect_ms", "stop_ms", "respawn_ms", "connect_ms", "restore_ms", "first_step_ms"}) {
    figs.push_back(
        {std::string("  ftrun agents: ") + part, Num(f, (std::string("agent_") + part).c_str()), "ms", "", true});
  }
  const nlohmann::json& w = j["ftrun_warm"]["summary"];
  const double warm = Num(j, "warm_recovery_speedup"), warm_restore = Num(j, "warm_restore_speedup");
  const double ready = Num(w, "survivor_ready_s");
  figs.push_back({"warm_recovery_speedup", warm, "ratio", ">= 4", warm >= 4});
  figs.push_back({"  ftrun warm: kill -> first step", Num(w, "recovery_s"), "s", "", true});
  figs.push_back({"    kill -> generation begun (abort, park)", Num(w, "segment_kill_to_generation_s"), "s", "", true});
  figs.push_back({"    process group, optimizer", Num(w, "segment_setup_s"), "s", "", true});
  figs.push_back({"    restore", Num(w, "segment_restore_s"), "s", "", true});
  figs.push_back({"    first step", Num(w, "segment_first_step_s"), "s", "", true});
  figs.push_back(
      {"warm_ready_speedup (the same to every rank ready to step)", Num(j, "warm_ready_speedup"), "ratio", "", true});
  figs.push_back({"  torch: kill -> every rank ready to step", Num(t, "ready_s"), "s", "", true});
  figs.push_back({"  ftrun warm: kill -> every rank ready to step", Num(w, "ready_s"), "s", "", true});
  figs.push_back({"warm_restore_speedup", warm_restore, "ratio", ">= 10", warm_restore >= 10});
  figs.push_back({"  ftrun.restore in place (slowest survivor)", Num(w, "survivor_restore_s"), "s", "", true});
  figs.push_back({"survivor_ready_s (kill -> survivors ready to step)", ready, "s", "< 0.5", ready > 0 && ready < 0.5});
  figs.push_back({"  kill -> the victim's exit (the kernel's part; pidfd)", Num(w, "victim_exit_s"), "s", "", true});
  for (const char* part : {"detect_ms", "stop_ms", "respawn_ms", "connect_ms", "restore_ms", "first_step_ms"}) {
    figs.push_back(
        {std::string("  ftrun warm agents: ") + part, Num(w, (std::string("agent_") + part).c_str()), "ms", "", true});
  }
  const double state_mib = Num(j["ftrun"], "state_bytes_min") / (1 << 20);
  figs.push_back({"state per rank (smallest)", state_mib, "MiB", ">= 256", state_mib >= 256});
  out->details = j;
  return 0;
}

}  // namespace ftrun::bench
