// ftrun-bench SCENARIO [--json FILE] [scenario flags]
//
// Prints a table of figures, each a ratio against a ceiling measured in the
// same run (memcpy) or a measured time, and writes them as JSON.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "bench/bench_util.h"

namespace ftrun::bench {

int RunBaselineTorch(int argc, char** argv, Result* out);  // bench/baseline_torch_bench.cc
int RunFlush(int argc, char** argv, Result* out);          // bench/flush_bench.cc
int RunErasure(int argc, char** argv, Result* out);        // bench/erasure_bench.cc
int RunScale(int argc, char** argv, Result* out);          // bench/scale_bench.cc
int RunPeers(int argc, char** argv);                       // bench/peers_bench.cc (execs its driver)

std::string SiblingBinary(const std::string& name) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string self = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  auto slash = self.rfind('/');
  return slash == std::string::npos ? name : self.substr(0, slash + 1) + name;
}

bool PathExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string DirOf(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string BenchScript(const std::string& name, const std::string& source_file) {
  const std::string here = DirOf(source_file) + "/" + name;
  if (!here.empty() && here[0] == '/' && PathExists(here)) return here;
  return DirOf(SiblingBinary("ftrun-bench")) + "/../bench/" + name;
}

pid_t StartProgram(const std::string& path, const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  std::string exe = path;
  argv.push_back(exe.data());
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    if (!log.empty()) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
    }
    ::execvp(exe.c_str(), argv.data());  // (python3 from PATH)
    std::perror(("exec " + exe).c_str());
    ::_exit(127);
  }
  return pid;
}

pid_t StartAgent(const std::vector<std::string>& args) { return StartProgram(SiblingBinary("ftrun-agent"), args, ""); }

pid_t StartOneRankWorker(const std::string& config, const std::string& job_id, const std::string& status,
                         const std::string& worker, const std::vector<std::string>& worker_args) {
  std::vector<std::string> args = {"--config",
                                   config,
                                   "--nproc",
                                   "1",
                                   "--job-id",
                                   job_id,
                                   "--status-file",
                                   status,
                                   "--no_python",
                                   "--no_local_rank",
                                   SiblingBinary("ftrun-bench"),
                                   worker};
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return StartAgent(args);
}

int WaitExit(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return ExitCode(st);
}

bool ReadJson(const std::string& path, nlohmann::json* out) {
  std::ifstream f(path);
  if (!f) return false;
  *out = nlohmann::json::parse(f, nullptr, false);
  return !out->is_discarded();
}

}  // namespace ftrun::bench

namespace {

void Print(const ftrun::bench::Result& r) {
  std::printf("\nftrun-bench %s\n", r.scenario.c_str());
  std::printf("%-34s %14s  %-8s %-10s %s\n", "figure", "value", "unit", "target", "");
  for (const auto& f : r.figures) {
    std::printf("%-34s %14.4f  %-8s %-10s %s\n", f.name.c_str(), f.value, f.unit.c_str(), f.target.c_str(),
                f.target.empty() ? "" : (f.met ? "met" : "MISSED"));
  }
}

void WriteJson(const ftrun::bench::Result& r, const std::string& path) {
  nlohmann::json j;
  j["scenario"] = r.scenario;
  for (const auto& f : r.figures) {
    j["figures"][f.name] = {{"value", f.value}, {"unit", f.unit}, {"target", f.target}, {"met", f.met}};
  }
  j["details"] = r.details;
  std::ofstream(path) << j.dump(2) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ftrun::bench;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0) {
    std::printf(
        "usage: ftrun-bench SCENARIO [--json FILE] [flags]\nscenarios:\n"
        "  save            save stall vs memcpy, incremental saves (1 GiB per rank by default);\n"
        "                  --cuda: a 4 GiB GPU state vs pinned D2H and D2D copies\n"
        "  restart-local   kill a rank of 4, time until every rank completed a step after restore\n"
        "  replicate       replication to a holder over UCX vs ucx_perftest; incremental bytes on the wire\n"
        "  restart-node    4 nodes x 2 ranks, kill a node, time until every rank completed a step\n"
        "  baseline-torch  train_gpt.py: torch.save/torch.load + relaunch vs ftrun (save, restore, recovery)\n"
        "  flush           the lazy flusher's disk rate vs fio; step time with and without it\n"
        "  erasure         the erasure code vs ISA-L; 6 nodes with 4+2 vs replicas 2: memory, wire, rebuild\n"
        "  scale           the coordinator against N simulated agents: CPU, commit latency, silent node, orders\n"
        "  peers           one DDP job under DCP, torchft, its own checkpoint and ftrun: stall, memory, recovery\n"
        "Run 'ftrun-bench SCENARIO --help' for a scenario's flags.\n");
    return argc < 2 ? 2 : 0;
  }
  std::string scenario = argv[1];
  if (scenario == "save-worker") return RunSaveWorker(argc - 1, argv + 1);
  if (scenario == "peers") return RunPeers(argc - 2, argv + 2);  // its driver prints the JSON
#ifdef FTRUN_HAVE_CUDA
  if (scenario == "save-cuda-worker") return RunSaveCudaWorker(argc - 1, argv + 1);
#endif
  std::string json_path;
  std::vector<char*> rest = {argv[0]};
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc)
      json_path = argv[++i];
    else
      rest.push_back(argv[i]);
  }
  Result r;
  r.scenario = scenario;
  int rc;
  if (scenario == "save")
    rc = RunSave(static_cast<int>(rest.size()), rest.data(), &r);
  else if (scenario == "restart-local")
    rc = RunRestartLocal(static_cast<int>(rest.size()), rest.data(), &r);
  else if (scenario == "replicate")
    rc = RunReplicate(static_cast<int>(rest.size()), rest.data(), &r);
  else if (scenario == "restart-node")
    rc = RunRestartNode(static_cast<int>(rest.size()), rest.data(), &r);
  else if (scenario == "baseline-torch")
    rc = RunBaselineTorch(static_cast<int>(rest.size()), rest.data(), &r);
  else if (scenario == "flush")
    rc = RunFlush(static_cast<int>(rest.size()), rest.data(), &r);
  else if (scenario == "erasure")
    rc = RunErasure(static_cast<int>(rest.size()), rest.data(), &r);
  else if (scenario == "scale")
    rc = RunScale(static_cast<int>(rest.size()), rest.data(), &r);
  else {
    std::fprintf(
        stderr,
        "ftrun-bench: unknown scenario '%s' (save, restart-local, replicate, restart-node, baseline-torch, flush, "
        "erasure, scale, peers)\n",
        scenario.c_str());
    return 2;
  }
  if (rc != 0) return rc;
  Print(r);
  if (!json_path.empty()) WriteJson(r, json_path);
  return 0;
}
