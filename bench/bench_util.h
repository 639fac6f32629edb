// Helpers shared by the ftrun-bench scenarios.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ftrun::bench {

struct Figure {
  std::string name;
  double value;
  std::string unit;
  std::string target;  // e.g. "<= 1.3", empty when only reported
  bool met = true;
};

struct Result {
  std::string scenario;
  std::vector<Figure> figures;
  nlohmann::json details = nlohmann::json::object();
};

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// UCX over TCP on loopback: the same transport for the agents, for
// ucx_perftest and for the scale benchmark's calibration.
inline void UseTcpOnLoopback() {
  ::setenv("UCX_TLS", "tcp,self", 1);
  ::setenv("UCX_NET_DEVICES", "lo", 1);
}

inline double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

inline int64_t MonoNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Path of a sibling binary (ftrun-agent, ftrun-synthetic) of this one.
std::string SiblingBinary(const std::string& name);
bool PathExists(const std::string& path);
// The directory part of a path ("." when it has none).
std::string DirOf(const std::string& path);
// A Python driver of the benchmarks, bench/<name>: beside `source_file`
// (pass __FILE__) when that is an absolute path that exists, else
// ../bench from this binary's directory.
std::string BenchScript(const std::string& name, const std::string& source_file);
// Starts path (a bare name: from PATH) with args (output to log, if given); returns its pid.
pid_t StartProgram(const std::string& path, const std::vector<std::string>& args, const std::string& log);
// Starts ftrun-agent with args; returns its pid.
pid_t StartAgent(const std::vector<std::string>& args);
// Starts ftrun-agent (config, job id, status file) whose one rank is this
// ftrun-bench in `worker` mode with worker_args; returns the agent's pid.
pid_t StartOneRankWorker(const std::string& config, const std::string& job_id, const std::string& status,
                         const std::string& worker, const std::vector<std::string>& worker_args);
// A waitpid() status as a shell-style exit code: the exit status, or 128 + the signal.
inline int ExitCode(int wait_status) {
  return WIFSIGNALED(wait_status) ? 128 + WTERMSIG(wait_status) : WEXITSTATUS(wait_status);
}
// Waits for pid to exit; returns its shell-style exit code.
int WaitExit(pid_t pid);
// Reads a JSON file; false while it does not exist or is partial.
bool ReadJson(const std::string& path, nlohmann::json* out);

int RunSave(int argc, char** argv, Result* out);
int RunSaveWorker(int argc, char** argv);
// save --cuda (save_cuda_bench.cu; built where nvcc exists).
// python: the interpreter of bench/cuda_step_overhead.py ("" skips it).
int RunSaveCuda(const std::string& state, int reps, int tensors, const std::string& chunk, const std::string& python,
                Result* out);
int RunSaveCudaWorker(int argc, char** argv);
int RunRestartLocal(int argc, char** argv, Result* out);
int RunReplicate(int argc, char** argv, Result* out);
int RunRestartNode(int argc, char** argv, Result* out);

}  // namespace ftrun::bench
