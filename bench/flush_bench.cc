// Scenario "flush": the agent's lazy flusher against the disk it writes to.
//
// Throughput. N ranks of ftrun-synthetic under a real ftrun-agent, every
// byte of the state changed at every step (--change-fraction 1.0), persist.dir
// on a real disk (refused on tmpfs), persist.every_versions 1, so every
// version goes to disk whole. The trainer sleeps long between steps (the
// emulated compute), so a version is written while the ranks idle. The rate
// of a version is what the agent says it wrote over the time the write took
// (its log line "persist: version V on disk in X ms (Y MiB written, ...)").
// The ceiling is fio in the same directory, in the same run: new files of
// the same bytes in all, each written sequentially with O_DIRECT through
// io_uring and fsync'ed once at its end (end_fsync=1: a version is durable
// when the writer is done with it, so the ceiling must be too). Before the
// agent, fio runs a sweep of a few shapes - one file at depth 4 and at 16,
// four files at once with 1 MiB writes at depth 4 or 4 MiB writes at depth 1
// (as the writer does); this virtio disk does worse at depth 16 than at 4 -
// and the best shape then runs again in the gap after every version is on
// disk, while the ranks compute (a whole sweep in every gap slowed the disk
// down for the versions after it). Each version but the first (which also
// makes the chunk directories) is compared with the mean of the fio runs
// just before and just after it, and throughput_over_fio is the median of
// those ratios: the disk is shared and its speed drifts by tens of percent
// within minutes, so a ceiling measured next to each version is the fair
// one. A sweep after the agent, and the median version over the median of
// the sweeps' best, are reported too.
//
// Step slowdown. The same trainer with a shorter emulated compute and
// persist on (every_versions 1: the flusher writes back to back while the
// ranks train) against persist off, in pairs, the order alternating. Step
// time: each rank prints "STEP r s" (--verbose) into its own log, which this
// process follows every few ms; the mean step of a run is the time between
// the first and the last step of its window over the steps between, and the
// window starts once the store is pre-faulted and a few steps have passed.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "bench/bench_util.h"

namespace ftrun::bench {
namespace {

constexpr long kTmpfsMagic = 0x01021994;
constexpr uint64_t kChunkBytes = 4ull << 20;  // store.chunk_size default
constexpr uint64_t kChunkHeader = 4096;       // disk_format.h kChunkHeaderSize

// "512MiB", "1GiB", "4096": powers of 1024, as ftrun-synthetic reads them.
bool ParseBytes(const std::string& s, uint64_t* out) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  std::string unit = end;
  const std::map<std::string, uint64_t> units = {{"", 1},           {"B", 1},
                                                 {"K", 1ull << 10}, {"KiB", 1ull << 10},
                                                 {"M", 1ull << 20}, {"MiB", 1ull << 20},
                                                 {"G", 1ull << 30}, {"GiB", 1ull << 30}};
  auto it = units.find(unit);
  if (end == s.c_str() || it == units.end()) return false;
  *out = v * it->second;
  return true;
}

std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path != nullptr ? path : "/usr/bin:/bin");
  std::string d;
  while (std::getline(ss, d, ':')) {
    std::string p = (d.empty() ? "." : d) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void RemoveTree(const std::string& path) {
  if (path.size() < 8 || path.find("ftrun-bench") == std::string::npos) return;  // never anything else
  pid_t pid = StartProgram("/bin/rm", {"-rf", "--", path}, "");
  WaitExit(pid);
}

// Waits for pid up to `limit`; SIGKILLs it after that. Returns the exit code.
int WaitExitFor(pid_t pid, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  int st = 0;
  while (true) {
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "ftrun-bench flush: pid %d still running after %lld s; killing it\n", pid,
                   static_cast<long long>(limit.count()));
      ::kill(pid, SIGKILL);
      return WaitExit(pid);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

struct FioConfig {
  std::string bs;
  int depth = 16;
  int jobs = 1;
  std::string ToString() const { return "bs " + bs + " qd " + std::to_string(depth) + " x " + std::to_string(jobs); }
};

// "1M:4:1,1M:16:1": block size, io_uring depth, files written at once.
bool ParseFioConfigs(const std::string& text, std::vector<FioConfig>* out) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    FioConfig c;
    char bs[32];
    if (std::sscanf(item.c_str(), "%31[^:]:%d:%d", bs, &c.depth, &c.jobs) != 3 || c.depth < 1 || c.jobs < 1)
      return false;
    c.bs = bs;
    out->push_back(c);
  }
  return !out->empty();
}

// fio: `jobs` new files of `bytes` in all in `dir`, each written
// sequentially with O_DIRECT writes of `bs` through io_uring at `depth`, and
// fsync'ed at its end. GB/s over all of them, or < 0 on failure.
double RunFio(const std::string& fio, const std::string& dir, uint64_t bytes, const FioConfig& c,
              const std::string& scratch) {
  const std::string name = "ftrun-bench-fio." + std::to_string(::getpid());
  const std::string json = scratch + ".fio.json", log = scratch + ".fio.log";
  uint64_t per_job = (bytes / static_cast<uint64_t>(c.jobs) + (1u << 20) - 1) >> 20 << 20;
  pid_t pid =
      StartProgram(fio,
                   {"--name=" + name, "--directory=" + dir, "--rw=write", "--bs=" + c.bs,
                    "--size=" + std::to_string(per_job), "--numjobs=" + std::to_string(c.jobs), "--group_reporting",
                    "--direct=1", "--ioengine=io_uring", "--iodepth=" + std::to_string(c.depth), "--end_fsync=1",
                    "--fallocate=none", "--output-format=json", "--output=" + json},
                   log);
  int rc = WaitExitFor(pid, std::chrono::seconds(300));
  for (int i = 0; i < c.jobs; ++i) ::unlink((dir + "/" + name + "." + std::to_string(i) + ".0").c_str());
  nlohmann::json j;
  double gbs = -1;
  if (rc == 0 && ReadJson(json, &j) && j.contains("jobs") && !j["jobs"].empty()) {
    gbs = j["jobs"][0]["write"]["bw_bytes"].get<double>() / 1e9;
  } else {
    std::fprintf(stderr, "ftrun-bench flush: fio failed (exit %d): %s\n", rc, ReadAll(log).c_str());
  }
  ::unlink(json.c_str());
  ::unlink(log.c_str());
  return gbs;
}

struct RunSpec {
  int ranks = 2;
  std::string state = "512MiB";
  uint64_t state_bytes = 0;
  int steps = 0;
  int step_ms = 0;
  double change_fraction = 1.0;
  std::string persist_dir;  // "" = persist off
  int drain_s = 0;
  std::string scratch;  // prefix of this run's files
};

struct VersionWrite {
  uint64_t version = 0;
  double ms = 0, mib_written = 0, mib_skipped = 0;
};

struct RunResult {
  bool ok = false;
  std::vector<std::map<uint64_t, double>> step_s;  // per rank: step -> steady-clock seconds it was seen
  double prefaulted_s = -1;                        // when the status first said so
  std::vector<VersionWrite> writes;                // from the agent's log
  double writing_fraction = 0;                     // status samples with persist.state "writing", in the window
  std::vector<std::pair<double, bool>> writing_samples;
  // The ranks' /proc/<pid>/schedstat summed: time on a CPU and time waiting
  // for one (runnable, not running), sampled with the status.
  struct Sched {
    double t, run_s, wait_s;
  };
  std::vector<Sched> sched;
  double rank_run_ms_per_step = 0, rank_wait_ms_per_step = 0;  // in the window, per rank
  int refused_saves = 0;     // "save of version V refused" in the agent's log (store full)
  double cpu_ours_s = 0;     // the agent's and the ranks' CPU time
  double cpu_machine_s = 0;  // every process's, from /proc/stat
  double wall_s = 0;
  std::string error;
};

// CPU seconds of the whole machine so far (user, nice, system, irq, softirq, steal).
double MachineCpuSeconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double v[8] = {0};
  f >> cpu >> v[0] >> v[1] >> v[2] >> v[3] >> v[4] >> v[5] >> v[6] >> v[7];
  return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// CPU seconds of this process's reaped children (the agent, and the ranks it reaped).
double ChildrenCpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_CHILDREN, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// "persist: version V on disk in X ms (Y MiB written, Z MiB already there)"
std::vector<VersionWrite> ParseWrites(const std::string& log) {
  std::vector<VersionWrite> out;
  const std::string key = "persist: version ";
  for (size_t at = log.find(key); at != std::string::npos; at = log.find(key, at + 1)) {
    VersionWrite w;
    unsigned long long v = 0;
    if (std::sscanf(log.c_str() + at, "persist: version %llu on disk in %lf ms (%lf MiB written, %lf MiB already", &v,
                    &w.ms, &w.mib_written, &w.mib_skipped) == 4) {
      w.version = v;
      out.push_back(w);
    }
  }
  return out;
}

// Follows the ranks' logs for "STEP r s" lines and stamps each when seen.
class StepFollower {
 public:
  StepFollower(const std::string& dir, int ranks) : files_(ranks, -1), partial_(ranks), steps_(ranks) {
    for (int r = 0; r < ranks; ++r) paths_.push_back(dir + "/rank" + std::to_string(r) + ".log");
  }
  void Poll() {
    double now = Seconds(std::chrono::steady_clock::now().time_since_epoch());
    char buf[65536];
    for (size_t r = 0; r < paths_.size(); ++r) {
      if (files_[r] < 0) files_[r] = ::open(paths_[r].c_str(), O_RDONLY | O_CLOEXEC);
      if (files_[r] < 0) continue;
      ssize_t n;
      while ((n = ::read(files_[r], buf, sizeof buf)) > 0) partial_[r].append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = partial_[r].find('\n')) != std::string::npos) {
        int rank = 0;
        unsigned long long step = 0;
        if (std::sscanf(partial_[r].c_str(), "STEP %d %llu", &rank, &step) == 2) steps_[r].emplace(step, now);
        partial_[r].erase(0, nl + 1);
      }
    }
  }
  ~StepFollower() {
    for (int fd : files_) {
      if (fd >= 0) ::close(fd);
    }
  }
  std::vector<std::map<uint64_t, double>> steps() const { return steps_; }

 private:
  std::vector<std::string> paths_;
  std::vector<int> files_;
  std::vector<std::string> partial_;
  std::vector<std::map<uint64_t, double>> steps_;
};

// on_version: called on this thread as soon as the agent logs that a
// version is on disk (while it runs, the ranks' logs are not followed).
RunResult RunAgent(const std::string& synthetic, const RunSpec& s,
                   const std::function<void(const VersionWrite&)>& on_version = nullptr) {
  RunResult res;
  const std::string cfg = s.scratch + ".yaml", status = s.scratch + ".status.json", log = s.scratch + ".agent.log";
  const std::string logs = s.scratch + ".ranks";
  ::mkdir(logs.c_str(), 0755);
  // The store holds the version being written, the newest committed one and
  // the ones being saved (a rank may be a step ahead of another), each whole
  // (every chunk changes): 4 x the state was seen to refuse a save now and
  // then with persist on; 6 x never did.
  const uint64_t budget_mib = 6 * static_cast<uint64_t>(s.ranks) * s.state_bytes >> 20;
  std::ofstream y(cfg);
  y << "job:\n  max_restarts: 0\n  hang_timeout: 300s\n  stop_grace: 2s\n"
    << "store:\n  memory_budget: " << budget_mib << "MiB\n"
    << "agent:\n  run_dir: " << s.scratch << ".run\n  log_level: info\n";
  if (!s.persist_dir.empty()) {
    y << "persist:\n  dir: " << s.persist_dir << "\n  every_versions: 1\n  every_seconds: 0s\n  keep: 2\n"
      << "  drain_timeout: " << s.drain_s << "s\n";
  }
  y.close();
  char fraction[32];
  std::snprintf(fraction, sizeof fraction, "%g", s.change_fraction);
  pid_t agent = StartProgram(SiblingBinary("ftrun-agent"),
                             {"--config",
                              cfg,
                              "--nproc",
                              std::to_string(s.ranks),
                              "--job-id",
                              "bench-flush",
                              "--status-file",
                              status,
                              "--enable_each_rank_log",
                              logs,
                              "--no_python",
                              "--no_local_rank",
                              synthetic,
                              "--state-bytes",
                              s.state,
                              "--tensors",
                              "8",
                              "--steps",
                              std::to_string(s.steps),
                              "--step-ms",
                              std::to_string(s.step_ms),
                              "--change-fraction",
                              fraction,
                              "--verbose"},
                             log);
  const double cpu0 = ChildrenCpuSeconds(), machine0 = MachineCpuSeconds();
  const auto wall0 = std::chrono::steady_clock::now();
  StepFollower follow(logs, s.ranks);
  int log_fd = -1;
  std::string log_partial;
  auto follow_log = [&] {
    if (!on_version) return;
    if (log_fd < 0) log_fd = ::open(log.c_str(), O_RDONLY | O_CLOEXEC);
    char buf[16384];
    ssize_t n;
    while (log_fd >= 0 && (n = ::read(log_fd, buf, sizeof buf)) > 0) log_partial.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = log_partial.find('\n')) != std::string::npos) {
      std::vector<VersionWrite> w = ParseWrites(log_partial.substr(0, nl));
      log_partial.erase(0, nl + 1);
      if (!w.empty()) on_version(w[0]);
    }
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  auto last_status = std::chrono::steady_clock::time_point{};
  int st = 0;
  bool exited = false;
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    follow.Poll();
    follow_log();
    auto now = std::chrono::steady_clock::now();
    if (now - last_status >= std::chrono::milliseconds(50)) {
      last_status = now;
      nlohmann::json j;
      if (ReadJson(status, &j)) {
        if (res.prefaulted_s < 0 && j["store"]["prefaulted"] == true)
          res.prefaulted_s = Seconds(now.time_since_epoch());
        if (j.contains("persist"))
          res.writing_samples.emplace_back(Seconds(now.time_since_epoch()), j["persist"]["state"] == "writing");
        RunResult::Sched x{Seconds(now.time_since_epoch()), 0, 0};
        int seen = 0;
        for (const auto& rank : j["ranks"]) {
          std::ifstream f("/proc/" + std::to_string(rank["pid"].get<int>()) + "/schedstat");
          double run_ns = 0, wait_ns = 0;
          if (f >> run_ns >> wait_ns) ++seen;
          x.run_s += run_ns / 1e9;
          x.wait_s += wait_ns / 1e9;
        }
        if (seen == s.ranks) res.sched.push_back(x);
      }
    }
    pid_t r = ::waitpid(agent, &st, WNOHANG);
    if (r == agent) {
      exited = true;
      break;
    }
  }
  follow.Poll();
  if (exited) follow_log();  // the last version's line, written just before the agent exited
  if (log_fd >= 0) ::close(log_fd);
  int rc = exited ? (WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st)) : -1;
  if (!exited) {
    ::kill(agent, SIGTERM);
    rc = WaitExitFor(agent, std::chrono::seconds(30));
    res.error = "the job did not finish in 10 minutes";
  }
  res.cpu_ours_s = ChildrenCpuSeconds() - cpu0;
  res.cpu_machine_s = MachineCpuSeconds() - machine0;
  res.wall_s = Seconds(std::chrono::steady_clock::now() - wall0);
  const std::string agent_log = ReadAll(log);
  res.writes = ParseWrites(agent_log);
  for (size_t at = agent_log.find(" refused: "); at != std::string::npos; at = agent_log.find(" refused: ", at + 1)) {
    ++res.refused_saves;
  }
  res.step_s = follow.steps();
  res.ok = rc == 0 && res.error.empty();
  if (rc != 0 && res.error.empty()) {
    res.error = "the agent exited with " + std::to_string(rc) + "; its log ends:\n" +
                agent_log.substr(agent_log.size() > 3000 ? agent_log.size() - 3000 : 0);
  }
  for (int r = 0; r < s.ranks && res.ok; ++r) {
    if (static_cast<int>(res.step_s[r].size()) < s.steps) {
      res.ok = false;
      res.error = "rank " + std::to_string(r) + " reported " + std::to_string(res.step_s[r].size()) + " of " +
                  std::to_string(s.steps) + " steps; the agent's log ends:\n" +
                  agent_log.substr(agent_log.size() > 3000 ? agent_log.size() - 3000 : 0);
    }
  }
  ::unlink(cfg.c_str());
  ::unlink(status.c_str());
  ::unlink(log.c_str());
  RemoveTree(logs);
  RemoveTree(s.scratch + ".run");
  return res;
}

// Waits (up to `limit`) for a second in which the machine's CPU time stays
// under `cores`: nothing of ours runs at this point, so it is others'.
void WaitForQuiet(double cores, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    double c0 = MachineCpuSeconds();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    if (MachineCpuSeconds() - c0 <= cores) return;
  }
}

// Mean step time of a run (seconds): per rank, from the first step after the
// warm-up (and after the store was pre-faulted) to the last, averaged over
// the ranks. Also the fraction of the window the flusher was writing.
double MeanStep(RunResult* r, int warmup, double* first_s, double* last_s) {
  double sum = 0;
  int n = 0;
  *first_s = 1e300;
  *last_s = 0;
  for (const auto& steps : r->step_s) {
    auto it = steps.begin();
    int skipped = 0;
    while (it != steps.end() && (skipped < warmup || it->second < r->prefaulted_s)) {
      ++it;
      ++skipped;
    }
    if (it == steps.end()) continue;
    auto last = std::prev(steps.end());
    if (last->first <= it->first) continue;
    sum += (last->second - it->second) / static_cast<double>(last->first - it->first);
    *first_s = std::min(*first_s, it->second);
    *last_s = std::max(*last_s, last->second);
    ++n;
  }
  int in = 0, writing = 0;
  for (const auto& [t, w] : r->writing_samples) {
    if (t < *first_s || t > *last_s) continue;
    ++in;
    writing += w;
  }
  r->writing_fraction = in > 0 ? static_cast<double>(writing) / in : 0;
  const double mean = n > 0 ? sum / n : 0;
  const RunResult::Sched* a = nullptr;
  const RunResult::Sched* b = nullptr;
  for (const auto& x : r->sched) {
    if (a == nullptr && x.t >= *first_s) a = &x;
    if (x.t <= *last_s) b = &x;
  }
  if (a != nullptr && b != nullptr && b->t > a->t && mean > 0 && !r->step_s.empty()) {
    const double steps_per_rank = (b->t - a->t) / mean, ranks = static_cast<double>(r->step_s.size());
    r->rank_run_ms_per_step = (b->run_s - a->run_s) / ranks / steps_per_rank * 1e3;
    r->rank_wait_ms_per_step = (b->wait_s - a->wait_s) / ranks / steps_per_rank * 1e3;
  }
  return mean;
}

}  // namespace

int RunFlush(int argc, char** argv, Result* out) {
  CLI::App app{"ftrun-bench flush: the lazy flusher's disk throughput vs fio; step time with and without it"};
  int ranks = 2, versions = 8, thr_step_ms = 5000, step_ms = 100, steps = 60, pairs = 5, warmup = 15;
  int fio_runs = 1;
  std::string state = "512MiB", dir = "/var/tmp", fio_configs = "1M:4:1,1M:16:1,1M:4:4,4M:1:4";
  bool allow_tmpfs = false, skip_throughput = false, skip_slowdown = false;
  double max_foreign = 0.15;
  int retries = 3, quiet_wait_s = 120;
  app.add_option("--ranks", ranks, "ranks of ftrun-synthetic");
  app.add_option("--state", state, "state per rank (every byte changes at every step)");
  app.add_option("--dir", dir, "where persist.dir and fio's file go (a real disk, not tmpfs)");
  app.add_option("--versions", versions, "throughput: versions written (the first is not counted)");
  app.add_option("--throughput-step-ms", thr_step_ms, "throughput: emulated compute per step (ranks idle meanwhile)");
  app.add_option("--fio-runs", fio_runs,
                 "fio sweeps of every configuration before the agent, and as many after (>= 1); between versions "
                 "only the best configuration before runs");
  app.add_option("--fio", fio_configs,
                 "fio configurations of a round, BS:DEPTH:FILES, the best of each round counts (the writer: 4 files "
                 "at a time, one 4 MiB write in flight each)");
  app.add_option("--step-ms", step_ms, "slowdown: emulated compute per step");
  app.add_option("--steps", steps, "slowdown: steps per run");
  app.add_option("--pairs", pairs, "slowdown: pairs of runs, persist off and on (order alternating)");
  app.add_option("--warmup", warmup, "slowdown: steps not counted at the start of a run");
  app.add_option("--max-foreign-cores", max_foreign,
                 "slowdown: a run during which other processes used more CPU than this is run again");
  app.add_option("--retries", retries, "slowdown: times a disturbed run is run again");
  app.add_option("--quiet-wait", quiet_wait_s, "seconds to wait for other processes to go quiet before a run");
  app.add_flag("--allow-tmpfs", allow_tmpfs, "measure on tmpfs anyway (for testing the scenario)");
  app.add_flag("--skip-throughput", skip_throughput, "only the step slowdown");
  app.add_flag("--skip-slowdown", skip_slowdown, "only the throughput");
  CLI11_PARSE(app, argc, argv);

  uint64_t state_bytes = 0;
  if (!ParseBytes(state, &state_bytes) || state_bytes == 0) {
    std::fprintf(stderr, "ftrun-bench flush: --state '%s' is not a size like 512MiB\n", state.c_str());
    return 2;
  }
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) {
    std::fprintf(stderr, "ftrun-bench flush: cannot stat the filesystem of '%s': %s\n", dir.c_str(),
                 std::strerror(errno));
    return 1;
  }
  if (static_cast<long>(fs.f_type) == kTmpfsMagic && !allow_tmpfs) {
    std::fprintf(stderr, "ftrun-bench flush: '%s' is tmpfs, which measures memory, not a disk; give --dir on a disk\n",
                 dir.c_str());
    return 2;
  }
  std::vector<FioConfig> configs;
  if (!ParseFioConfigs(fio_configs, &configs)) {
    std::fprintf(stderr, "ftrun-bench flush: --fio '%s' is not a list like 1M:4:1,1M:16:1\n", fio_configs.c_str());
    return 2;
  }
  const std::string fio = FindInPath("fio");
  if (fio.empty() && !skip_throughput) {
    std::fprintf(stderr, "ftrun-bench flush: fio is not on PATH (apt-get install fio)\n");
    return 1;
  }
  const std::string synthetic = SiblingBinary("ftrun-synthetic");
  const std::string scratch = "/tmp/ftrun-bench-flush-" + std::to_string(::getpid());
  const std::string persist_dir = dir + "/ftrun-bench-flush-" + std::to_string(::getpid());
  // Bytes of one whole version on disk: the chunks with their headers.
  const uint64_t chunks = (state_bytes + kChunkBytes - 1) / kChunkBytes;
  uint64_t version_bytes = static_cast<uint64_t>(ranks) * (state_bytes + chunks * kChunkHeader);
  version_bytes = (version_bytes + (1u << 20) - 1) >> 20 << 20;
  out->details = {
      {"dir", dir}, {"filesystem_magic", static_cast<long>(fs.f_type)}, {"ranks", ranks}, {"state_per_rank", state}};

  if (!skip_throughput) {
    std::vector<double> fio_gbs, sweep_gbs;        // the best of each round; of the sweeps only
    std::map<std::string, double> best_by_config;  // over the sweeps before the agent
    auto fio_round = [&](const std::string& when, const std::vector<FioConfig>& cs) {
      double best = -1;
      for (const FioConfig& c : cs) {
        double g = RunFio(fio, dir, version_bytes, c, scratch);
        best = std::max(best, g);
        if (when == "before") best_by_config[c.ToString()] = std::max(best_by_config[c.ToString()], g);
        std::fprintf(stderr, "fio %s, %s: %.3f GB/s\n", when.c_str(), c.ToString().c_str(), g);
        out->details["fio_gb_s"].push_back({{"when", when}, {"config", c.ToString()}, {"gb_s", g}});
      }
      if (best > 0) fio_gbs.push_back(best);
      if (best > 0 && cs.size() == configs.size()) sweep_gbs.push_back(best);
      return best;
    };
    WaitForQuiet(max_foreign, std::chrono::seconds(quiet_wait_s));
    for (int i = 0; i < std::max(fio_runs, 1); ++i) fio_round("before", configs);
    // Between versions only the configuration that did best before: a whole
    // sweep in every gap (4 GiB) was seen to slow this disk down for the
    // versions after it, fio's own runs not.
    std::vector<FioConfig> gap_config = {configs[0]};
    for (const FioConfig& c : configs) {
      if (best_by_config[c.ToString()] > best_by_config[gap_config[0].ToString()]) gap_config = {c};
    }
    out->details["fio_between_versions"] = gap_config[0].ToString();
    // A round of fio right after each version is on disk, in the gap before
    // the next one (the ranks compute meanwhile): each version is compared
    // with the rounds just before and just after it. A gap round still
    // running when the next step's saves came in is not counted.
    struct Gap {
      uint64_t version;
      double best, end_s;
    };
    std::vector<Gap> gaps;
    auto on_version = [&](const VersionWrite& w) {
      double best = fio_round("after version " + std::to_string(w.version), gap_config);
      gaps.push_back({w.version, best, Seconds(std::chrono::steady_clock::now().time_since_epoch())});
    };
    RunSpec s;
    s.ranks = ranks;
    s.state = state;
    s.state_bytes = state_bytes;
    s.steps = versions;
    s.step_ms = thr_step_ms;
    s.persist_dir = persist_dir;
    s.drain_s = 120;  // the last version goes to disk before the agent exits
    s.scratch = scratch + ".thr";
    RunResult r = RunAgent(synthetic, s, on_version);
    RemoveTree(persist_dir);
    if (!r.ok) {
      std::fprintf(stderr, "ftrun-bench flush: throughput run failed: %s\n", r.error.c_str());
      return 1;
    }
    if (r.refused_saves > 0) std::fprintf(stderr, "warning: %d saves refused (store full)\n", r.refused_saves);
    out->details["throughput_saves_refused"] = r.refused_saves;
    // Saves of step v+1 seen (every rank) before the round after version v
    // ended: the next version's write may have overlapped that round.
    auto overlapped = [&](const Gap& g) {
      for (const auto& steps : r.step_s) {
        auto it = steps.find(g.version + 1);
        if (it != steps.end() && it->second < g.end_s) return true;
      }
      return false;
    };
    std::vector<double> rates, ratios;
    nlohmann::json writes = nlohmann::json::array();
    for (size_t i = 0; i < r.writes.size(); ++i) {
      const VersionWrite& w = r.writes[i];
      double gbs = w.ms > 0 ? w.mib_written * 1048576.0 / (w.ms / 1e3) / 1e9 : 0;
      double ratio = 0;
      std::string note = i == 0 ? "first: not counted" : w.mib_skipped > 0 ? "not whole: not counted" : "";
      if (note.empty() && i < gaps.size() && gaps[i].version == w.version && gaps[i - 1].version + 1 == w.version) {
        const Gap &before = gaps[i - 1], &after = gaps[i];
        if (overlapped(before) || overlapped(after) || before.best <= 0 || after.best <= 0) {
          note = "a fio round overlapped a write: not counted";
        } else {
          ratio = gbs / ((before.best + after.best) / 2);
          rates.push_back(gbs);
          ratios.push_back(ratio);
        }
      } else if (note.empty()) {
        note = "no fio round on both sides: not counted";
      }
      writes.push_back({{"version", w.version},
                        {"ms", w.ms},
                        {"mib_written", w.mib_written},
                        {"mib_skipped", w.mib_skipped},
                        {"gb_s", gbs},
                        {"over_fio_around", ratio},
                        {"note", note}});
      std::fprintf(stderr, "version %llu: %.1f MiB in %.0f ms = %.3f GB/s, %.3f of the fio rounds around it%s%s\n",
                   static_cast<unsigned long long>(w.version), w.mib_written, w.ms, gbs, ratio,
                   note.empty() ? "" : "; ", note.c_str());
    }
    for (int i = 0; i < std::max(fio_runs, 1); ++i) fio_round("after", configs);
    out->details["versions"] = writes;
    if (ratios.empty() || fio_gbs.empty()) {
      std::fprintf(stderr, "ftrun-bench flush: no whole version written after the first with fio rounds around it\n");
      return 1;
    }
    double rate = Median(rates), ceiling = Median(fio_gbs), ratio = Median(ratios);
    out->figures.push_back({"throughput_over_fio", ratio, "ratio", ">= 0.9", ratio >= 0.9});
    out->figures.push_back({"  flush (median version)", rate, "GB/s", "", true});
    out->figures.push_back({"  fio (median of every round)", ceiling, "GB/s", "", true});
    out->figures.push_back({"  median version over median fio", rate / ceiling, "ratio", "", true});
    const double sweep = Median(sweep_gbs);
    out->figures.push_back({"  fio, best shape before/after", sweep, "GB/s", "", true});
    out->figures.push_back({"  median version over that", rate / sweep, "ratio", "", true});
    out->figures.push_back({"  versions counted", static_cast<double>(ratios.size()), "", "", true});
    out->figures.push_back({"  version bytes", static_cast<double>(version_bytes) / 1048576.0, "MiB", "", true});
  }

  if (!skip_slowdown) {
    std::vector<double> ratios;
    nlohmann::json runs = nlohmann::json::array();
    for (int p = 0; p < pairs; ++p) {
      double mean[2] = {0, 0};  // [persist off, persist on]
      for (int k = 0; k < 2; ++k) {
        const bool on = (p % 2 == 0) ? k == 1 : k == 0;
        RunSpec s;
        s.ranks = ranks;
        s.state = state;
        s.state_bytes = state_bytes;
        s.steps = steps;
        s.step_ms = step_ms;
        s.persist_dir = on ? persist_dir : "";
        s.drain_s = 0;
        s.scratch = scratch + ".slow";
        // The machine is shared: a run during which other processes took
        // more than --max-foreign-cores is run again (the table says so).
        for (int attempt = 0;; ++attempt) {
          WaitForQuiet(max_foreign, std::chrono::seconds(quiet_wait_s));
          RunResult r = RunAgent(synthetic, s);
          RemoveTree(persist_dir);
          if (!r.ok) {
            std::fprintf(stderr, "ftrun-bench flush: step run (persist %s) failed: %s\n", on ? "on" : "off",
                         r.error.c_str());
            return 1;
          }
          double first = 0, last = 0;
          double m = MeanStep(&r, warmup, &first, &last);
          const double others = (r.cpu_machine_s - r.cpu_ours_s) / r.wall_s;
          // A refused save (the store full) skips the copy: such a step is
          // not comparable.
          const bool disturbed = others > max_foreign || r.refused_saves > 0;
          std::fprintf(
              stderr,
              "pair %d, persist %s: mean step %.1f ms (a rank on a CPU %.1f ms of it, waiting for one %.1f ms), "
              "%zu versions written, flusher writing %.0f%%; CPU: agent and ranks %.2f cores, other "
              "processes %.2f cores; %d saves refused%s\n",
              p, on ? "on" : "off", m * 1e3, r.rank_run_ms_per_step, r.rank_wait_ms_per_step, r.writes.size(),
              100 * r.writing_fraction, r.cpu_ours_s / r.wall_s, others, r.refused_saves,
              !disturbed          ? ""
              : attempt < retries ? " (disturbed: again)"
                                  : " (disturbed: kept)");
          runs.push_back({{"pair", p},
                          {"persist", on},
                          {"mean_step_ms", m * 1e3},
                          {"versions_written", r.writes.size()},
                          {"writing_fraction", r.writing_fraction},
                          {"window_s", last - first},
                          {"cpu_cores_ours", r.cpu_ours_s / r.wall_s},
                          {"cpu_cores_others", others},
                          {"rank_on_cpu_ms_per_step", r.rank_run_ms_per_step},
                          {"rank_waiting_for_cpu_ms_per_step", r.rank_wait_ms_per_step},
                          {"saves_refused", r.refused_saves},
                          {"counted", !disturbed || attempt >= retries}});
          if (!disturbed || attempt >= retries) {
            mean[on ? 1 : 0] = m;
            break;
          }
        }
      }
      if (mean[0] > 0) ratios.push_back(mean[1] / mean[0]);
    }
    out->details["step_runs"] = runs;
    if (ratios.empty()) {
      std::fprintf(stderr, "ftrun-bench flush: no step times\n");
      return 1;
    }
    double slow = Median(ratios);
    out->figures.push_back({"step_slowdown", slow, "ratio", "<= 1.05", slow <= 1.05});
    std::vector<double> off, on;
    for (const auto& r : runs) {
      if (r["counted"].get<bool>()) (r["persist"].get<bool>() ? on : off).push_back(r["mean_step_ms"].get<double>());
    }
    out->figures.push_back({"  step, persist off (median run)", Median(off), "ms", "", true});
    out->figures.push_back({"  step, persist on (median run)", Median(on), "ms", "", true});
    out->details["step_slowdown_per_pair"] = ratios;
    out->details["step_ms"] = step_ms;
    out->details["steps"] = steps;
  }
  return 0;
}

}  // namespace ftrun::bench
