#include "launcher/runner/status_command.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plugin/common/file.h"
#include "plugin/common/proc_start.h"
#include "plugin/config/config.h"
#include "plugin/config/units.h"

namespace ftrun {
namespace {

using nlohmann::json;

bool IsFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The job in run_dir whose status.json changed last.
std::string NewestJob(const std::string& run_dir) {
  std::string best;
  int64_t best_mtime = -1;
  DIR* d = ::opendir(run_dir.c_str());
  if (d == nullptr) return best;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string path = run_dir + "/" + name + "/status.json";
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && st.st_mtime > best_mtime) {
      best_mtime = st.st_mtime;
      best = path;
    }
  }
  ::closedir(d);
  return best;
}

bool ReadJsonFile(const std::string& path, json* out, std::string* error) {
  std::string text;
  Status s = ReadWholeFile(path, "status file '" + path + "'", &text);
  if (!s.ok()) return *error = s.message(), false;
  *out = json::parse(text, nullptr, false);
  if (out->is_discarded()) return *error = path + ": not valid JSON (written by another version?)", false;
  return true;
}

std::string Str(const json& j, const char* key, const std::string& none = "-") {
  if (!j.contains(key) || j[key].is_null()) return none;
  return j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
}

// Milliseconds, whole.
std::string Ms(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f", j[key].get<double>());
  return buf;
}

std::string Size(const json& store, const char* key) {
  return store.contains(key) ? FormatSize(store[key].get<uint64_t>()) : "-";
}

// "node 1, restart 2: <reason>: 640 ms (stop 30, respawn 40, ...)"
std::string RestartLine(const json& n, const json& r) {
  std::string line = "  node " + Str(n, "node") + ", restart " + Str(r, "restart") + ": " + Str(r, "reason");
  if (!r.contains("total_ms")) return line + ": not finished";
  line += ": " + Ms(r, "total_ms") + " ms to the first step (";
  const char* parts[][2] = {{"stop_ms", "stop"},
                            {"respawn_ms", "respawn"},
                            {"connect_ms", "connect"},
                            {"restore_ms", "restore"},
                            {"first_step_ms", "first step"}};
  for (const auto& p : parts) line += std::string(p[1]) + " " + Ms(r, p[0]) + (p[0] == parts[4][0] ? ")" : ", ");
  return line + ", version " + Str(r, "version");
}

// The flusher of a node: "v12 +3" (the newest version on disk, committed
// versions not on disk yet), "FAILING" while the disk fails; "-" without a
// persist dir.
std::string Disk(const json& agent) {
  if (!agent.contains("persist")) return "-";
  const json& p = agent["persist"];
  std::string s = p["last_written_version"].is_null() ? "none" : "v" + Str(p, "last_written_version");
  s += " +" + Str(p, "backlog_versions");
  if (p.value("failures_in_a_row", 0) > 0) s += " FAILING";
  return s;
}

void PrintNodes(const json& st) {
  std::vector<std::string> restarts_done;
  std::printf("\n%-5s %-6s %-22s %-6s %-8s %-10s %-24s %-10s %-14s %s\n", "node", "agent", "address", "ranks", "rack",
              "state", "store used / capacity", "committed", "disk +backlog", "restarts");
  for (const auto& n : st["nodes"]) {
    json agent;
    std::string err, state = "lost", store = "-", committed = "-", restarts = "-", disk = "-";
    if (!n["agent"].is_null()) {
      const int id = n["agent"].get<int>();
      for (const auto& a : st["agents"]) {
        if (a["agent"].get<int>() == id && ReadJsonFile(a["status_file"].get<std::string>(), &agent, &err)) {
          state = Str(agent, "state");
          store = Size(agent["store"], "used_bytes") + " / " + Size(agent["store"], "capacity_bytes");
          committed = Str(agent, "committed_version");
          disk = Disk(agent);
          restarts = Str(agent, "restarts");
          for (const auto& r : agent["recoveries"]) restarts_done.push_back(RestartLine(n, r));
        }
      }
      if (agent.is_null()) state = "no status";
    }
    std::printf("%-5s %-6s %-22s %-6s %-8s %-10s %-24s %-10s %-14s %s\n", Str(n, "node").c_str(),
                Str(n, "agent").c_str(), Str(n, "address").c_str(), Str(n, "ranks").c_str(), Str(n, "rack", "").c_str(),
                state.c_str(), store.c_str(), committed.c_str(), disk.c_str(), restarts.c_str());
    if (agent.contains("persist") && !agent["persist"].value("last_error", std::string()).empty()) {
      std::printf("      disk error: %s\n", agent["persist"]["last_error"].get<std::string>().c_str());
    }
  }
  std::string spares;
  for (const auto& s : st["spares"])
    spares += (spares.empty() ? "" : ", ") + Str(s, "agent") + " at " + Str(s, "address");
  std::printf("spares: %s\n", spares.empty() ? "none" : spares.c_str());
  if (!restarts_done.empty()) std::printf("\nrestarts, as each node saw them:\n");
  for (const auto& line : restarts_done) std::printf("%s\n", line.c_str());
}

// Per group: how many more node losses its committed version survives.
void PrintErasure(const json& e) {
  const int parity = e["parity"].get<int>();
  std::printf("redundancy: erasure code, data %d + parity %d per group\n", e["data"].get<int>(), parity);
  for (const auto& g : e["groups"]) {
    std::string nodes;
    for (const auto& n : g["nodes"]) nodes += (nodes.empty() ? "" : ", ") + std::to_string(n.get<int>());
    const int survives = g["survives"].is_null() ? parity : g["survives"].get<int>();
    std::string what = "LOST: a lost node cannot be rebuilt (more losses than the parity)";
    if (survives >= 0) {
      what = "survives " + std::to_string(survives) + " more node loss" + (survives == 1 ? "" : "es");
      if (survives < parity) what += " (DEGRADED until the next commit)";
    }
    std::printf("  group of nodes %s: %s\n", nodes.c_str(), what.c_str());
  }
}

void PrintRedundancy(const json& st) {
  if (!st.contains("committed_copies")) {
    std::printf("redundancy: nothing committed yet\n");
    return;
  }
  if (st.contains("erasure")) return PrintErasure(st["erasure"]);
  const int want = 1 + st["replicas"].get<int>();
  std::string short_ranks;
  int min_copies = want;
  int r = 0;
  for (const auto& c : st["committed_copies"]) {
    min_copies = std::min(min_copies, c.get<int>());
    if (c.get<int>() < want) short_ranks += (short_ranks.empty() ? "" : ", ") + std::to_string(r);
    ++r;
  }
  if (short_ranks.empty()) {
    std::printf("redundancy: every rank's committed version is held by %d live nodes (1 + replicas %d)\n", want,
                want - 1);
  } else {
    std::printf("redundancy: DEGRADED, ranks %s have fewer than %d live copies (fewest: %d) until the next commit\n",
                short_ranks.c_str(), want, min_copies);
  }
}

void PrintRecoveries(const json& st) {
  bool any = false;
  for (const auto& r : st["recoveries"]) {
    if (r["epoch"].get<uint64_t>() == 0) continue;  // the job's start
    if (!any) std::printf("\nrecoveries:\n");
    any = true;
    std::printf("  epoch %s: %s; detect to start %s ms\n", Str(r, "epoch").c_str(), Str(r, "reason").c_str(),
                Ms(r, "detect_to_start_ms").c_str());
  }
}

}  // namespace

int RunStatusCommand(int argc, char** argv) {
  CLI::App app{"ftrun status: a job's health (nodes, spares, commits, redundancy, memory, restarts)"};
  app.name("ftrun status");
  std::string job, run_dir, config_path;
  bool as_json = false;
  app.add_option("job", job, "job id, or the path of a status file (default: the latest job in the run dir)");
  app.add_option("--run_dir", run_dir, "the jobs' run dir (default: agent.run_dir of --config, else the built-in one)");
  app.add_option("--config", config_path, "ftrun YAML config the job was started with");
  app.add_flag("--json", as_json, "print the runner's status JSON, each agent's status inlined");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  Config config = DefaultConfig();
  if (!config_path.empty()) {
    Status s = LoadConfigFile(config_path, &config);
    if (!s.ok()) return std::fprintf(stderr, "ftrun status: %s\n", s.message().c_str()), 2;
  }
  if (run_dir.empty()) run_dir = config.agent.run_dir;
  std::string path;
  if (job.empty()) {
    path = NewestJob(run_dir);
    if (path.empty()) {
      std::fprintf(stderr,
                   "ftrun status: no job in %s (no <job>/status.json); pass a job id, a status file, or "
                   "--run_dir\n",
                   run_dir.c_str());
      return 2;
    }
  } else {
    path = IsFile(job) ? job : run_dir + "/" + job + "/status.json";
  }
  json st;
  std::string err;
  if (!ReadJsonFile(path, &st, &err)) return std::fprintf(stderr, "ftrun status: %s\n", err.c_str()), 2;
  for (const char* key : {"phase", "nodes", "spares", "agents", "recoveries", "replicas"}) {
    if (!st.contains(key)) {
      std::fprintf(stderr, "ftrun status: %s: field '%s' missing; expected a status file written by the ftrun runner\n",
                   path.c_str(), key);
      return 2;
    }
  }
  const std::string phase = st["phase"].get<std::string>();
  const bool finished = st.contains("exit_code");
  // A recycled pid is not the runner: the start time recorded next to it must match (proc_start.h).
  const bool runner_alive = st.contains("runner_pid") && st.contains("runner_start_time") &&
                            SameProcess(st["runner_pid"].get<int>(), st["runner_start_time"].get<uint64_t>());
  if (as_json) {
    for (auto& a : st["agents"]) {
      json agent;
      if (ReadJsonFile(a["status_file"].get<std::string>(), &agent, &err)) a["status"] = agent;
    }
    std::printf("%s\n", st.dump(2).c_str());
  } else {
    std::printf("job %s: %s, epoch %s, committed version %s, %s restart(s)\n", Str(st, "job_id").c_str(), phase.c_str(),
                Str(st, "epoch").c_str(), Str(st, "committed_version", "none").c_str(),
                Str(st, "restarts", "0").c_str());
    std::printf("status file: %s\n", path.c_str());
    if (finished) {
      std::printf("finished: exit code %s%s%s\n", Str(st, "exit_code").c_str(),
                  Str(st, "exit_message", "").empty() ? "" : ": ", Str(st, "exit_message", "").c_str());
    } else if (!runner_alive) {
      std::printf("the runner (pid %s) is gone and the job did not finish: these are its last known figures\n",
                  Str(st, "runner_pid").c_str());
    }
    if (!finished && st.contains("coordinator_leader") && st["coordinator_leader"].is_object()) {
      const json& l = st["coordinator_leader"];
      std::printf("coordinator: pid %s at %s, leading through etcd (term %s, key %s)\n", Str(st, "runner_pid").c_str(),
                  Str(st, "coordinator", "?").c_str(), Str(l, "term", "?").c_str(), Str(l, "etcd_key", "?").c_str());
    }
    if (!finished) PrintRedundancy(st);
    if (!finished && runner_alive && !Str(st, "metrics_address", "").empty())
      std::printf("metrics: http://%s/metrics\n", Str(st, "metrics_address", "").c_str());
    if (st.value("persist_dir", std::string()).empty()) {
      std::printf("disk: persist.dir not set (committed versions live in RAM only)\n");
    } else {
      std::printf("disk: %s (each node's newest version there, and its backlog, below)\n",
                  st["persist_dir"].get<std::string>().c_str());
    }
    PrintNodes(st);
    PrintRecoveries(st);
  }
  if (finished) return st["exit_code"].get<int>() == 0 ? 0 : 1;
  return runner_alive ? 0 : 1;
}

}  // namespace ftrun
