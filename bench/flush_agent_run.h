// One run of the flush scenario (bench/flush_bench.cc): ranks of
// ftrun-synthetic under a real ftrun-agent, persist on or off, followed
// while they run - each rank's steps (its log's "STEP r s" lines, stamped
// when seen), the agent's status (pre-faulted, the flusher writing, the
// ranks' CPU time) and its log (each version on disk) - and the mean step
// time of a run's window.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ftrun::bench::flush {

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

// Runs s.ranks ranks of `synthetic` under ftrun-agent until the job ends
// (10 minutes at most) and removes the run's files. on_version: called on
// this thread as soon as the agent logs that a version is on disk (while it
// runs, the ranks' logs are not followed).
RunResult RunAgent(const std::string& synthetic, const RunSpec& s,
                   const std::function<void(const VersionWrite&)>& on_version = nullptr);

// Mean step time of a run (seconds): per rank, from the first step after the
// warm-up (and after the store was pre-faulted) to the last, averaged over
// the ranks. Also the fraction of the window the flusher was writing.
double MeanStep(RunResult* r, int warmup, double* first_s, double* last_s);

}  // namespace ftrun::bench::flush
