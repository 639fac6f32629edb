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
//
// The parts: flush_agent_run (one run of the agent and what it measured),
// flush_fio (the ceiling), flush_host (programs, files, children, CPU time).
#include <sys/vfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "bench/bench_util.h"
#include "bench/flush_agent_run.h"
#include "bench/flush_fio.h"
#include "bench/flush_host.h"

namespace ftrun::bench {
namespace {

using flush::FindInPath;
using flush::FioConfig;
using flush::MeanStep;
using flush::ParseFioConfigs;
using flush::RemoveTree;
using flush::RunAgent;
using flush::RunFio;
using flush::RunResult;
using flush::RunSpec;
using flush::VersionWrite;
using flush::WaitForQuiet;

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
