// Scenario "save --cuda": one rank's CUDA state saved through the C++ CUDA
// path, against ceilings measured in the same process and run: a pinned
// synchronous cudaMemcpy D2H of the same bytes, and a device-to-device copy.
//
// The parent starts a real ftrun-agent whose single rank is this binary in
// "save-cuda-worker" mode; the worker measures and writes JSON.
//
// Figures (the issue's names):
//   cuda_stall_over_d2h     time inside Save (previous save landed) / D2H
//   changed_d2h_over_peak   changed-chunk copy rate / pinned D2H rate
//   fingerprint_over_hbm    fingerprint kernel rate / D2D copy rate
//   register_s              cudaHostRegister of the store (first Save)
#include <cuda_runtime.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <thread>

#include "bench/bench_util.h"
#include "ftrun/client.h"
#include "plugin/client/fingerprint_kernel.h"

namespace ftrun::bench {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "save-cuda-worker: %s\n", what.c_str());
  std::exit(1);
}

void Cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(e));
}

__global__ void FillKernel(uint64_t* p, uint64_t words, uint64_t seed) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    x ^= x >> 31;
    p[i] = x * 0xbf58476d1ce4e5b9ull;
  }
}

// Writes a new stamp into the first word of the listed chunks (a step that
// changes them), on `stream`.
__global__ void TouchKernel(uint64_t* base, const uint64_t* word_offsets, uint64_t n, uint64_t stamp) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i < n) base[word_offsets[i]] = stamp + i;
}

double Since(std::chrono::steady_clock::time_point t0) { return Seconds(std::chrono::steady_clock::now() - t0); }

}  // namespace

int RunSaveCudaWorker(int argc, char** argv) {
  CLI::App app{"save-cuda-worker"};
  uint64_t state_bytes = 4ull << 30;
  int tensors = 16, reps = 5;
  std::string out;
  app.add_option("--state-bytes", state_bytes);
  app.add_option("--tensors", tensors);
  app.add_option("--reps", reps);
  app.add_option("--out", out)->required();
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<Client> client;
  Status st = Client::Connect({}, &client);
  if (!st.ok()) Die(st.ToString());
  const uint64_t cs = client->chunk_size();
  const uint64_t tensor_bytes = state_bytes / static_cast<uint64_t>(tensors) / cs * cs;
  const uint64_t total = tensor_bytes * static_cast<uint64_t>(tensors);
  const uint64_t chunks = total / cs;
  char* dev = nullptr;
  Cuda(cudaMalloc(&dev, total), "cudaMalloc state");
  FillKernel<<<1024, 256>>>(reinterpret_cast<uint64_t*>(dev), total / 8, 7);
  Cuda(cudaDeviceSynchronize(), "fill");
  cudaStream_t stream;
  Cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  std::vector<TensorRef> refs;
  for (int i = 0; i < tensors; ++i) {
    TensorRef r;
    r.name = "layer." + std::to_string(i) + ".weight";
    r.dtype = DType::kFloat32;
    r.shape = {static_cast<int64_t>(tensor_bytes / 4)};
    r.data = dev + static_cast<uint64_t>(i) * tensor_bytes;
    r.nbytes = tensor_bytes;
    r.device = Device::kCuda;
    refs.push_back(r);
  }
  SaveOptions opts;
  opts.cuda_stream = stream;
  uint64_t version = 0, stamp = 1;
  SaveStats stats;
  auto save = [&](SaveStats* s) {
    Status r = client->Save(++version, refs, "", opts, s);
    if (!r.ok()) Die("save: " + r.ToString());
  };
  auto wait = [&] {
    Status r = client->Wait();
    if (!r.ok()) Die("wait: " + r.ToString());
  };
  // Chunk lists: every chunk, and a scattered 10%.
  std::vector<uint64_t> all_words, tenth_words;
  std::mt19937_64 rng(3);
  for (uint64_t c = 0; c < chunks; ++c) {
    all_words.push_back(c * cs / 8);
    if (rng() % 10 == 0) tenth_words.push_back(c * cs / 8);
  }
  uint64_t *dev_all = nullptr, *dev_tenth = nullptr;
  Cuda(cudaMalloc(&dev_all, all_words.size() * 8), "cudaMalloc");
  Cuda(cudaMalloc(&dev_tenth, std::max<size_t>(1, tenth_words.size()) * 8), "cudaMalloc");
  Cuda(cudaMemcpy(dev_all, all_words.data(), all_words.size() * 8, cudaMemcpyHostToDevice), "copy");
  Cuda(cudaMemcpy(dev_tenth, tenth_words.data(), tenth_words.size() * 8, cudaMemcpyHostToDevice), "copy");
  auto touch = [&](const std::vector<uint64_t>& words, const uint64_t* dev_words) {
    const uint64_t n = words.size();
    TouchKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(reinterpret_cast<uint64_t*>(dev), dev_words,
                                                                            n, stamp += n);
    Cuda(cudaGetLastError(), "touch");
  };

  // First save: creates the CUDA path (cudaHostRegister of the store).
  auto t0 = std::chrono::steady_clock::now();
  save(nullptr);
  const double first_save_s = Since(t0);
  wait();
  for (int r = 0; r < 2; ++r) {  // warm-up: the store's extents mapped and registered
    touch(all_words, dev_all);
    save(nullptr);
    wait();
  }

  // Ceilings: pinned D2H, D2D, both synchronous.
  char* pinned = nullptr;
  char* dev2 = nullptr;
  Cuda(cudaMallocHost(&pinned, total), "cudaMallocHost");
  Cuda(cudaMalloc(&dev2, total), "cudaMalloc");
  std::memset(pinned, 0, total);
  std::vector<double> d2h_s, d2d_s, fp_s;
  unsigned long long* fps = nullptr;
  Cuda(cudaMalloc(&fps, chunks * 16), "cudaMalloc");
  for (int r = 0; r < reps; ++r) {
    t0 = std::chrono::steady_clock::now();
    Cuda(cudaMemcpy(pinned, dev, total, cudaMemcpyDeviceToHost), "D2H");
    d2h_s.push_back(Since(t0));
    t0 = std::chrono::steady_clock::now();
    Cuda(cudaMemcpy(dev2, dev, total, cudaMemcpyDeviceToDevice), "D2D");
    Cuda(cudaDeviceSynchronize(), "D2D");
    d2d_s.push_back(Since(t0));
    Cuda(cudaMemset(fps, 0, chunks * 16), "memset");
    Cuda(cudaDeviceSynchronize(), "memset");
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < tensors; ++i) {
      Cuda(LaunchChunkFingerprints(refs[static_cast<size_t>(i)].data, tensor_bytes, cs,
                                   fps + 2 * (static_cast<uint64_t>(i) * tensor_bytes / cs), nullptr),
           "fingerprint");
    }
    Cuda(cudaDeviceSynchronize(), "fingerprint");
    fp_s.push_back(Since(t0));
  }
  Cuda(cudaFreeHost(pinned), "cudaFreeHost");
  Cuda(cudaFree(dev2), "cudaFree");
  Cuda(cudaFree(fps), "cudaFree");

  // Every chunk changed, then a scattered 10%: the stall (time inside Save,
  // the previous save landed: a step is longer than the landing), the copy
  // time (Save + the stream's wait for the copies, less the fingerprints)
  // and the landing (copies + host chunk ids).
  auto measure = [&](const std::vector<uint64_t>& words, const uint64_t* dev_words, std::vector<double>* stall,
                     std::vector<double>* copy_rate, std::vector<double>* land_s, uint64_t* copied) {
    for (int r = 0; r < reps; ++r) {
      touch(words, dev_words);
      Cuda(cudaStreamSynchronize(stream), "touch");
      t0 = std::chrono::steady_clock::now();
      save(&stats);
      stall->push_back(stats.stall_seconds);
      Cuda(cudaStreamSynchronize(stream), "copies");          // the stream waits for the copies
      const double copies = Since(t0) - stats.stall_seconds;  // after the fingerprints
      copy_rate->push_back(static_cast<double>(stats.bytes_copied) / copies);
      wait();
      land_s->push_back(Since(t0));
      *copied = stats.bytes_copied;
    }
  };
  std::vector<double> full_stall, full_rate, full_land, tenth_stall, tenth_rate, tenth_land;
  uint64_t full_copied = 0, tenth_copied = 0;
  measure(all_words, dev_all, &full_stall, &full_rate, &full_land, &full_copied);
  measure(tenth_words, dev_tenth, &tenth_stall, &tenth_rate, &tenth_land, &tenth_copied);

  const double d2h = Median(d2h_s), d2d = Median(d2d_s), fp = Median(fp_s);
  nlohmann::json j = {{"state_bytes", total},
                      {"chunk_size", cs},
                      {"first_save_s", first_save_s},
                      {"d2h_s", d2h},
                      {"d2h_gbps", static_cast<double>(total) / d2h / 1e9},
                      {"d2d_s", d2d},
                      {"fingerprint_s", fp},
                      {"fingerprint_gbps", static_cast<double>(total) / fp / 1e9},
                      {"full_stall_s", Median(full_stall)},
                      {"full_copy_gbps", Median(full_rate) / 1e9},
                      {"full_land_s", Median(full_land)},
                      {"full_copied_bytes", full_copied},
                      {"tenth_stall_s", Median(tenth_stall)},
                      {"tenth_copy_gbps", Median(tenth_rate) / 1e9},
                      {"tenth_land_s", Median(tenth_land)},
                      {"tenth_copied_bytes", tenth_copied},
                      {"tenth_chunks", tenth_words.size()},
                      {"chunks", chunks},
                      {"reps", reps}};
  cudaDeviceProp prop{};
  int device = 0, driver = 0, runtime = 0;
  (void)cudaGetDevice(&device);
  (void)cudaGetDeviceProperties(&prop, device);
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  j["gpu"] = prop.name;
  j["cuda_driver"] = driver;
  j["cuda_runtime"] = runtime;
  std::ofstream(out) << j.dump(2);
  Cuda(cudaFree(dev), "cudaFree");
  return 0;
}

namespace {

// bench/cuda_step_overhead.py: train_gpt.py on the GPU with and without a
// save every step. False (and a message) when it fails.
bool StepOverhead(const std::string& python, nlohmann::json* out) {
  const std::string script = BenchScript("cuda_step_overhead.py", __FILE__);
  const std::string json_path = "/tmp/ftrun-bench-stepov-" + std::to_string(::getpid()) + ".json";
  std::fprintf(stderr, "ftrun-bench save --cuda: step_overhead (%s %s)...\n", python.c_str(), script.c_str());
  const int rc = WaitExit(StartProgram(
      python, {script, "--build", DirOf(SiblingBinary("ftrun-bench")), "--python", python, "--out", json_path}, ""));
  const bool ok = rc == 0 && ReadJson(json_path, out);
  ::unlink(json_path.c_str());
  if (!ok) std::fprintf(stderr, "ftrun-bench save --cuda: %s failed (exit %d)\n", script.c_str(), rc);
  return ok;
}

}  // namespace

int RunSaveCuda(const std::string& state, int reps, int tensors, const std::string& chunk, const std::string& python,
                Result* out) {
  const uint64_t state_bytes = std::stoull(state);
  const std::string dir = "/tmp/ftrun-bench-cuda-" + std::to_string(::getpid());
  const std::string cfg = dir + ".yaml", result = dir + ".json", status = dir + ".status.json";
  std::ofstream(cfg) << "store:\n  memory_budget: " << (state_bytes * 5 / 2 + (64ull << 20)) << "B\n"
                     << "  chunk_size: " << chunk << "\nagent:\n  run_dir: " << dir << "\n  log_level: warn\n";
  pid_t agent = StartOneRankWorker(cfg, "bench-save-cuda", status, "save-cuda-worker",
                                   {"--state-bytes", std::to_string(state_bytes), "--tensors", std::to_string(tensors),
                                    "--reps", std::to_string(reps), "--out", result});
  int rc = WaitExit(agent);
  ::unlink(status.c_str());
  nlohmann::json j;
  bool ok = rc == 0 && ReadJson(result, &j);
  ::unlink(cfg.c_str());
  ::unlink(result.c_str());
  if (!ok) {
    std::fprintf(stderr, "ftrun-bench save --cuda: the worker failed (agent exit %d)\n", rc);
    return 1;
  }
  const double d2h = j["d2h_s"], d2d = j["d2d_s"], fp = j["fingerprint_s"];
  const double d2h_rate = static_cast<double>(j["state_bytes"].get<uint64_t>()) / d2h / 1e9;
  auto fig = [&](const std::string& n, double v, const std::string& unit, const std::string& target, bool met) {
    out->figures.push_back({n, v, unit, target, met});
  };
  const double stall = j["full_stall_s"].get<double>() / d2h;
  const double changed = j["tenth_copy_gbps"].get<double>() / d2h_rate;
  const double full = j["full_copy_gbps"].get<double>() / d2h_rate;
  fig("d2h_gbps", d2h_rate, "GB/s", "", true);
  fig("cuda_stall_over_d2h", stall, "ratio", "<= 0.05", stall <= 0.05);
  fig("cuda_stall_tenth_over_d2h", j["tenth_stall_s"].get<double>() / d2h, "ratio", "", true);
  fig("changed_d2h_over_peak", changed, "ratio", ">= 0.8", changed >= 0.8);
  fig("full_d2h_over_peak", full, "ratio", "", true);
  fig("fingerprint_over_hbm", d2d / fp, "ratio", ">= 0.5", d2d / fp >= 0.5);
  fig("first_save_s", j["first_save_s"], "s", "", true);
  fig("landing_full_s", j["full_land_s"], "s", "", true);
  out->details = j;
  if (python.empty()) return 0;
  nlohmann::json step;
  if (!StepOverhead(python, &step)) return 1;
  const double overlap = step["step_overhead_overlap"];
  fig("step_overhead", step["step_overhead"], "ratio", "", true);
  fig("step_overhead_overlap", overlap, "ratio", "<= 1.03", overlap <= 1.03);
  out->details["step_overhead"] = step;
  return 0;
}

}  // namespace ftrun::bench
