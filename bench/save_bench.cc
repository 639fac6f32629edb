// Scenario "save": one rank's save stall against a plain memcpy of the same
// bytes into pre-faulted memory, measured in the same process and run.
//
// The parent starts a real ftrun-agent whose single rank is this binary in
// "save-worker" mode; the worker measures and writes JSON for the parent.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <thread>

#include "bench/bench_util.h"
#include "ftrun/client.h"
#include "launcher/common/install_paths.h"

namespace ftrun::bench {
namespace {

struct State {
  std::vector<std::unique_ptr<uint64_t[]>> tensors;
  uint64_t tensor_bytes = 0;
};

// Writes a new value into the first word of chunk `c` of tensor `t`.
void Touch(State& s, size_t t, uint64_t chunk_size, uint64_t c, uint64_t stamp) {
  s.tensors[t][c * chunk_size / 8] = stamp;
}

std::vector<TensorRef> Refs(const State& s, const std::vector<uint64_t>& gens) {
  std::vector<TensorRef> refs;
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    TensorRef r;
    r.name = "layer." + std::to_string(i) + ".weight";
    r.dtype = DType::kFloat32;
    r.shape = {static_cast<int64_t>(s.tensor_bytes / 4)};
    r.data = s.tensors[i].get();
    r.nbytes = s.tensor_bytes;
    r.generation = gens[i];
    refs.push_back(r);
  }
  return refs;
}

}  // namespace

int RunSaveWorker(int argc, char** argv) {
  CLI::App app{"save-worker"};
  uint64_t state_bytes = 1ull << 30;
  int tensors = 20, reps = 5;
  std::string out;
  app.add_option("--state-bytes", state_bytes);
  app.add_option("--tensors", tensors);
  app.add_option("--reps", reps);
  app.add_option("--out", out)->required();
  std::string go_file;
  app.add_option("--go-file", go_file, "wait for this file (the store is warm) before measuring");
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<Client> client;
  Status st = Client::Connect({}, &client);
  if (!st.ok()) {
    std::fprintf(stderr, "save-worker: %s\n", st.ToString().c_str());
    return 1;
  }
  const uint64_t cs = client->chunk_size();
  State s;
  s.tensor_bytes = state_bytes / static_cast<uint64_t>(tensors) / cs * cs;
  const uint64_t chunks_per_tensor = s.tensor_bytes / cs;
  const uint64_t total = s.tensor_bytes * static_cast<uint64_t>(tensors);
  std::mt19937_64 rng(1);
  for (int i = 0; i < tensors; ++i) {
    s.tensors.emplace_back(new uint64_t[s.tensor_bytes / 8]);
    for (uint64_t w = 0; w < s.tensor_bytes / 8; ++w) s.tensors.back()[w] = rng();
  }
  std::vector<uint64_t> gens(static_cast<size_t>(tensors), 0);
  uint64_t version = 0, stamp = 1;
  SaveStats stats;
  auto save = [&](SaveStats* out_stats) {
    Status r = client->Save(++version, Refs(s, gens), "", out_stats);
    if (!r.ok()) {
      std::fprintf(stderr, "save-worker: save failed: %s\n", r.ToString().c_str());
      std::exit(1);
    }
  };

  // Steady state, as in training: the agent's pages are allocated and this
  // process has mapped them (warm-up saves touch every extent in turn).
  for (int i = 0; i < 200 && !go_file.empty() && ::access(go_file.c_str(), F_OK) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (int r = 0; r < 3; ++r) {
    for (size_t t = 0; t < s.tensors.size(); ++t)
      for (uint64_t c = 0; c < chunks_per_tensor; ++c) Touch(s, t, cs, c, ++stamp);
    save(nullptr);
  }

  // Ceiling: memcpy of the same bytes into pre-faulted memory.
  std::unique_ptr<char[]> dst(new char[total]);
  std::memset(dst.get(), 0, total);
  std::vector<double> memcpy_s;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < tensors; ++i)
      std::memcpy(dst.get() + static_cast<uint64_t>(i) * s.tensor_bytes, s.tensors[static_cast<size_t>(i)].get(),
                  s.tensor_bytes);
    memcpy_s.push_back(Seconds(std::chrono::steady_clock::now() - t0));
  }
  dst.reset();

  std::vector<double> full_s;
  for (int r = 0; r < reps; ++r) {
    for (size_t t = 0; t < s.tensors.size(); ++t)
      for (uint64_t c = 0; c < chunks_per_tensor; ++c) Touch(s, t, cs, c, ++stamp);
    save(&stats);
    full_s.push_back(stats.stall_seconds);
  }
  const uint64_t full_copied = stats.bytes_copied;

  // 10% of the tensors change (as when most layers are frozen); the caller
  // passes generations, so untouched tensors are never read.
  const size_t changed_tensors = std::max<size_t>(1, s.tensors.size() / 10);
  for (auto& g : gens) g = 1;
  save(&stats);  // generations become known
  std::vector<double> incr_s, incr_ratio;
  for (int r = 0; r < reps; ++r) {
    for (size_t k = 0; k < changed_tensors; ++k) {
      size_t t = (static_cast<size_t>(r) * changed_tensors + k) % s.tensors.size();
      for (uint64_t c = 0; c < chunks_per_tensor; ++c) Touch(s, t, cs, c, ++stamp);
      gens[t] = version + 1;
    }
    save(&stats);
    incr_s.push_back(stats.stall_seconds);
    incr_ratio.push_back(static_cast<double>(stats.bytes_copied) / static_cast<double>(total));
  }

  // 10% of the chunks change, scattered over every tensor, no generations:
  // every chunk must be hashed.
  std::fill(gens.begin(), gens.end(), 0);
  save(&stats);
  std::vector<double> scat_s, scat_ratio;
  const uint64_t all_chunks = chunks_per_tensor * s.tensors.size();
  for (int r = 0; r < reps; ++r) {
    for (uint64_t k = 0; k < all_chunks / 10; ++k) {
      uint64_t c = rng() % all_chunks;
      Touch(s, c / chunks_per_tensor, cs, c % chunks_per_tensor, ++stamp);
    }
    save(&stats);
    scat_s.push_back(stats.stall_seconds);
    scat_ratio.push_back(static_cast<double>(stats.bytes_copied) / static_cast<double>(total));
  }

  nlohmann::json j = {{"state_bytes", total},
                      {"chunk_size", cs},
                      {"memcpy_s", Median(memcpy_s)},
                      {"full_save_s", Median(full_s)},
                      {"full_copied_bytes", full_copied},
                      {"incremental_s", Median(incr_s)},
                      {"incremental_bytes_ratio", Median(incr_ratio)},
                      {"scattered_s", Median(scat_s)},
                      {"scattered_bytes_ratio", Median(scat_ratio)},
                      {"reps", reps},
                      {"tensors", tensors}};
  std::ofstream(out) << j.dump(2);
  return 0;
}

int RunSave(int argc, char** argv, Result* out) {
  CLI::App app{"ftrun-bench save: per-rank save stall against memcpy"};
  std::string state = "1073741824";
  int reps = 5, tensors = 20;
  std::string chunk = "4MiB";
  app.add_option("--state-bytes", state, "bytes of state (plain integer)");
  app.add_option("--reps", reps, "repetitions per figure (median reported)");
  app.add_option("--tensors", tensors, "tensors the state is split into");
  app.add_option("--chunk-size", chunk, "store.chunk_size");
  bool cuda = false, no_step_overhead = false;
  std::string python = PythonInterpreter();  // the agent's rule: FTRUN_PYTHON, else python3
  app.add_flag("--cuda", cuda,
               "the state in GPU memory, saved by the CUDA path (4 GiB and 16 tensors unless given), "
               "against pinned D2H and D2D copies; then train_gpt.py's step_overhead on the GPU");
  app.add_option("--python", python, "--cuda: the interpreter for train_gpt.py (needs torch with CUDA)");
  app.add_flag("--no-step-overhead", no_step_overhead, "--cuda: skip the train_gpt.py step_overhead runs");
  CLI11_PARSE(app, argc, argv);
  if (cuda) {
#ifdef FTRUN_HAVE_CUDA
    return RunSaveCuda(app.count("--state-bytes") ? state : std::to_string(4ull << 30), reps,
                       app.count("--tensors") ? tensors : 16, chunk, no_step_overhead ? "" : python, out);
#else
    std::fprintf(stderr, "ftrun-bench save --cuda: this ftrun-bench was built without CUDA (no nvcc)\n");
    return 2;
#endif
  }
  const uint64_t state_bytes = std::stoull(state);

  const std::string dir = "/tmp/ftrun-bench-" + std::to_string(::getpid());
  const std::string cfg = dir + ".yaml", result = dir + ".json", status = dir + ".status.json", go = dir + ".go";
  // Room for the committed version plus one full save in flight.
  std::ofstream(cfg) << "store:\n  memory_budget: " << (state_bytes * 5 / 2 + (64ull << 20)) << "B\n"
                     << "  chunk_size: " << chunk << "\nagent:\n  run_dir: " << dir << "\n  log_level: warn\n";
  pid_t agent = StartOneRankWorker(cfg, "bench-save", status, "save-worker",
                                   {"--state-bytes", std::to_string(state_bytes), "--tensors", std::to_string(tensors),
                                    "--reps", std::to_string(reps), "--out", result, "--go-file", go});
  for (int i = 0; i < 1200; ++i) {
    nlohmann::json st;
    if (ReadJson(status, &st) && st["store"]["prefaulted"] == true) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::ofstream(go) << "go\n";
  int rc = WaitExit(agent);
  ::unlink(status.c_str());
  ::unlink(go.c_str());
  nlohmann::json j;
  bool ok = rc == 0 && ReadJson(result, &j);
  ::unlink(cfg.c_str());
  ::unlink(result.c_str());
  if (!ok) {
    std::fprintf(stderr, "ftrun-bench save: the worker failed (agent exit %d)\n", rc);
    return 1;
  }
  const double memcpy_s = j["memcpy_s"], full = j["full_save_s"], incr = j["incremental_s"], scat = j["scattered_s"];
  const double gbs = static_cast<double>(j["state_bytes"].get<uint64_t>()) / 1e9;
  auto fig = [&](const std::string& n, double v, const std::string& unit, const std::string& target, bool met) {
    out->figures.push_back({n, v, unit, target, met});
  };
  fig("memcpy_gbps", gbs / memcpy_s, "GB/s", "", true);
  fig("full_save_gbps", gbs / full, "GB/s", "", true);
  fig("stall_over_memcpy", full / memcpy_s, "ratio", "<= 1.3", full / memcpy_s <= 1.3);
  double ibr = j["incremental_bytes_ratio"];
  fig("incremental_bytes_ratio", ibr, "ratio", "<= 0.11", ibr <= 0.11);
  fig("incremental_stall_ratio", incr / full, "ratio", "<= 0.2", incr / full <= 0.2);
  fig("scattered_bytes_ratio", j["scattered_bytes_ratio"], "ratio", "", true);
  fig("scattered_stall_ratio", scat / full, "ratio", "", true);
  out->details = j;
  return 0;
}

}  // namespace ftrun::bench
