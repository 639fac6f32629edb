#include "bench/flush_agent_run.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "bench/bench_util.h"
#include "bench/flush_host.h"

namespace ftrun::bench::flush {
namespace {

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

}  // namespace

RunResult RunAgent(const std::string& synthetic, const RunSpec& s,
                   const std::function<void(const VersionWrite&)>& on_version) {
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
  int rc = exited ? ExitCode(st) : -1;
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

}  // namespace ftrun::bench::flush
