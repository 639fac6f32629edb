// ftrun-synthetic: a deterministic fake trainer for tests and benchmarks.
//
// The state is one buffer split into N float32 tensors. Every step rewrites
// some of it as a function of (old bytes, rank, step, block), saves it with
// ftrun and reports progress. Because each rewrite depends on the old bytes
// and is not an involution, the final digest matches a failure-free run
// (--no-ftrun) only if every step was applied exactly once, in order, on top
// of a correctly restored state. It can crash itself in several ways, in
// restart generation 0 only ($TORCHELASTIC_RESTART_COUNT unset or 0).
//
// Output (stdout): "restored version V (rank R, restart N)" after a restore
// (N: $TORCHELASTIC_RESTART_COUNT, the epoch in a cluster), "STEP <rank> <step>"
// per step with --verbose, "SAVE_FAILURES <rank> <n>" when saves were
// refused for lack of space, and last "DIGEST <rank> <32 hex>", the XXH3-128
// of the tensors in order. Exit 0, or 1 after printing a Status error.

#include <unistd.h>
#include <xxhash.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ftrun/client.h"
#include "ftrun/status.h"

namespace {

constexpr uint64_t kBlockBytes = 1 << 20;  // unit of change in scattered mode
constexpr uint64_t kInitSalt = 0x1d1f'a5c3'0000'0001ULL;
constexpr uint64_t kPickSalt = 0x7e1c'd00d'0000'0002ULL;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e37'79b9'7f4a'7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58'476d'1ce4'e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d0'49bb'1331'11ebULL;
  return x ^ (x >> 31);
}

uint64_t Seed(uint64_t rank, uint64_t step, uint64_t index) {
  return SplitMix64(SplitMix64(SplitMix64(rank) ^ step) ^ index);
}

double ToUnit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

// Rewrites each 8-byte word w (a zero-padded one for a short tail) as
// w * odd + key(i): a bijection of the old bytes, different at every step.
void Mutate(uint8_t* p, uint64_t n, uint64_t seed) {
  constexpr uint64_t kOdd = 0xd605'bbb5'8c8a'bbb5ULL;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    w = w * kOdd + SplitMix64(seed + i);
    std::memcpy(p + i, &w, 8);
  }
  if (i < n) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, n - i);
    w = w * kOdd + SplitMix64(seed + i);
    std::memcpy(p + i, &w, n - i);
  }
}

// "256MiB", "4G", "1048576": an integer with an optional K/M/G/T(iB) or B
// suffix, all powers of 1024.
bool ParseSize(const std::string& text, uint64_t* out) {
  size_t end = 0;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  if (end == 0 || end > 19) return false;
  const uint64_t value = std::stoull(text.substr(0, end));
  const std::string unit = text.substr(end);
  const std::string units[] = {"", "K", "M", "G", "T"};
  for (int i = 0; i < 5; ++i) {
    if (unit == units[i] || unit == units[i] + (i == 0 ? "B" : "iB")) {
      const uint64_t scale = uint64_t{1} << (10 * i);
      if (value > UINT64_MAX / scale) return false;
      *out = value * scale;
      return true;
    }
  }
  return false;
}

struct Options {
  uint64_t state_bytes = 0;
  int tensors = 1;
  uint64_t steps = 10;
  double change_fraction = 0.1;
  int change_only_rank = -1;  // -1: every rank's state changes
  std::string change_mode = "scattered";
  int step_ms = 0;
  int64_t crash_at_step = -1;
  std::string crash_mode = "kill";
  int crash_rank = 0;
  bool crash_during_save = false;
  bool no_ftrun = false;
  bool use_generations = false;
  bool verbose = false;
  int rank = -1;
};

[[noreturn]] void Crash(const std::string& mode, bool from_thread) {
  std::fflush(stdout);
  if (mode == "kill") std::raise(SIGKILL);
  if (mode == "segv") {
    volatile int* volatile null = nullptr;  // the compiler cannot see it is null
    *null = 1;
  }
  if (mode == "abort") std::abort();
  if (mode == "exit") {
    if (from_thread) std::_Exit(3);  // exit() would race the main thread's statics
    std::exit(3);
  }
  std::raise(SIGSTOP);  // "hang"; stays hung if continued
  for (;;) pause();
}

class Trainer {
 public:
  // fill: write the deterministic initial state. A trainer about to restore
  // skips it (the restore writes every byte), as a real one would skip a
  // random init it is about to overwrite.
  Trainer(const Options& opts, int rank, bool fill) : opts_(opts), rank_(rank) {
    const uint64_t floats = opts.state_bytes / 4, n = static_cast<uint64_t>(opts.tensors);
    uint64_t offset = 0;
    for (uint64_t t = 0; t < n; ++t) {
      const uint64_t count = floats / n + (t < floats % n ? 1 : 0);
      ftrun::TensorRef ref;
      ref.name = "layer." + std::to_string(t) + ".weight";
      ref.dtype = ftrun::DType::kFloat32;
      ref.shape = {static_cast<int64_t>(count)};
      ref.nbytes = count * 4;
      offsets_.push_back(offset);
      offset += ref.nbytes;
      tensors_.push_back(std::move(ref));
    }
    nwords_ = (opts.state_bytes + 7) / 8;
    words_.reset(new uint64_t[nwords_]);  // uninitialized: written below or by the restore
    if (fill) {
      const uint64_t seed = Seed(static_cast<uint64_t>(rank), 0, kInitSalt);
      for (uint64_t i = 0; i < nwords_; ++i) words_[i] = SplitMix64(seed + i);
    }
    for (size_t t = 0; t < tensors_.size(); ++t) tensors_[t].data = bytes() + offsets_[t];
    generations_.assign(tensors_.size(), 1);  // the initial fill counts as step 0
  }

  uint8_t* bytes() { return reinterpret_cast<uint8_t*>(words_.get()); }
  std::vector<ftrun::TensorRef>& tensors() { return tensors_; }

  // Applies step `step`'s changes (steps count from 1).
  void Step(uint64_t step) {
    if (opts_.change_only_rank >= 0 && opts_.change_only_rank != rank_) return;
    const auto rank = static_cast<uint64_t>(rank_);
    if (opts_.change_mode == "scattered") {
      for (uint64_t b = 0; b * kBlockBytes < opts_.state_bytes; ++b) {
        const uint64_t h = Seed(rank, step, b);
        if (ToUnit(h) >= opts_.change_fraction) continue;
        const uint64_t lo = b * kBlockBytes, hi = std::min(lo + kBlockBytes, opts_.state_bytes);
        Mutate(bytes() + lo, hi - lo, SplitMix64(h));
        auto t = std::upper_bound(offsets_.begin(), offsets_.end(), lo) - offsets_.begin() - 1;
        for (; t < static_cast<long>(offsets_.size()) && offsets_[t] < hi; ++t) {
          generations_[t] = step + 1;
        }
      }
      return;
    }
    // "tensors": a partial Fisher-Yates shuffle seeded by (rank, step).
    const size_t n = tensors_.size();
    const auto k = static_cast<size_t>(std::llround(opts_.change_fraction * double(n)));
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    uint64_t rng = Seed(rank, step, kPickSalt);
    for (size_t i = 0; i < k; ++i) {
      rng = SplitMix64(rng);
      std::swap(order[i], order[i + rng % (n - i)]);
      const size_t t = order[i];
      Mutate(bytes() + offsets_[t], tensors_[t].nbytes, Seed(rank, step, t));
      generations_[t] = step + 1;
    }
  }

  // Generation of tensor t for Save: 1 + the step it last changed at, so
  // that 0 keeps meaning "unknown".
  void SetGenerations(bool known) {
    for (size_t t = 0; t < tensors_.size(); ++t) {
      tensors_[t].generation = known ? generations_[t] : 0;
    }
  }

  // user bytes: step, tensor count, then each generation; all u64 LE.
  std::string EncodeUserBytes(uint64_t step) const {
    std::string out;
    auto put = [&](uint64_t v) {
      for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
    };
    put(step);
    put(generations_.size());
    for (uint64_t g : generations_) put(g);
    return out;
  }

  ftrun::Status Restore(const ftrun::Snapshot& snap) {
    if (snap.tensors().size() != tensors_.size()) {
      return ftrun::Status::FailedPrecondition("snapshot has " + std::to_string(snap.tensors().size()) +
                                               " tensors, the trainer " + std::to_string(tensors_.size()) +
                                               " (different --tensors?)");
    }
    for (size_t t = 0; t < tensors_.size(); ++t) {
      FTRUN_RETURN_IF_ERROR(snap.Read(tensors_[t].name, bytes() + offsets_[t], tensors_[t].nbytes));
    }
    const std::string& u = snap.user_bytes();
    auto get = [&](size_t i) {
      uint64_t v = 0;
      for (int b = 0; b < 8; ++b) {
        v |= static_cast<uint64_t>(static_cast<uint8_t>(u[8 * i + b])) << (8 * b);
      }
      return v;
    };
    if (u.size() != 8 * (2 + tensors_.size()) || get(0) != snap.version() || get(1) != tensors_.size()) {
      return ftrun::Status::Corruption("user bytes of version " + std::to_string(snap.version()) +
                                       " are not this trainer's step and generations");
    }
    for (size_t t = 0; t < tensors_.size(); ++t) generations_[t] = get(2 + t);
    return ftrun::Status::Ok();
  }

  std::string Digest() {
    const XXH128_hash_t h = XXH3_128bits(bytes(), opts_.state_bytes);  // the tensors, in order
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    char hex[33];
    for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", c.digest[i]);
    return hex;
  }

 private:
  const Options opts_;
  const int rank_;
  std::unique_ptr<uint64_t[]> words_;  // the state; uint64 for alignment
  uint64_t nwords_ = 0;
  std::vector<ftrun::TensorRef> tensors_;
  std::vector<uint64_t> offsets_;
  std::vector<uint64_t> generations_;
};

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::atoi(v) : fallback;
}

int Fail(int rank, const std::string& what, const ftrun::Status& st) {
  std::fprintf(stderr, "ftrun-synthetic rank %d: %s: %s\n", rank, what.c_str(), st.ToString().c_str());
  return 1;
}

int Run(const Options& opts) {
  const bool crash_generation = EnvInt("TORCHELASTIC_RESTART_COUNT", 0) == 0;
  std::unique_ptr<ftrun::Client> client;
  int rank = opts.rank >= 0 ? opts.rank : EnvInt("FTRUN_RANK", EnvInt("RANK", 0));
  if (!opts.no_ftrun) {
    ftrun::ClientOptions copts;
    copts.rank = opts.rank;
    ftrun::Status st = ftrun::Client::Connect(copts, &client);
    if (!st.ok()) return Fail(rank, "connect", st);
    rank = client->rank();
  }
  uint64_t step = 1, restore = 0;
  const bool restoring = client && client->restore_version(&restore);
  Trainer trainer(opts, rank, !restoring);
  if (restoring) {
    std::unique_ptr<ftrun::Snapshot> snap;
    ftrun::Status st = client->Load(restore, &snap);
    if (st.ok()) st = trainer.Restore(*snap);
    if (!st.ok()) return Fail(rank, "restore version " + std::to_string(restore), st);
    step = restore + 1;
    std::printf("restored version %llu (rank %d, restart %d)\n", static_cast<unsigned long long>(restore), rank,
                EnvInt("TORCHELASTIC_RESTART_COUNT", 0));
    std::fflush(stdout);
  }

  uint64_t refused_saves = 0;
  bool hash_all = false;  // after a refused save, until a save goes through
  for (; step <= opts.steps; ++step) {
    const bool crash_here =
        crash_generation && rank == opts.crash_rank && static_cast<int64_t>(step) == opts.crash_at_step;
    if (crash_here && !opts.crash_during_save) Crash(opts.crash_mode, false);
    if (opts.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opts.step_ms));
    trainer.Step(step);
    if (client) {
      std::unique_ptr<std::thread> killer;
      if (crash_here) {
        const auto delay = std::chrono::microseconds(std::random_device()() % 2001);
        killer = std::make_unique<std::thread>([&opts, delay] {
          std::this_thread::sleep_for(delay);
          Crash(opts.crash_mode, true);
        });
      }
      // A refused save may have recorded generations the store never kept.
      trainer.SetGenerations(opts.use_generations && !hash_all);
      ftrun::Status st = client->Save(step, trainer.tensors(), trainer.EncodeUserBytes(step));
      if (killer) killer->join();  // never returns: the killer ends the process
      if (st.code() == ftrun::Code::kResourceExhausted) {
        std::fprintf(stderr, "ftrun-synthetic rank %d: warning: step %llu not saved: %s\n", rank,
                     static_cast<unsigned long long>(step), st.ToString().c_str());
        ++refused_saves;
        hash_all = true;
      } else if (!st.ok()) {
        return Fail(rank, "save version " + std::to_string(step), st);
      } else {
        hash_all = false;
      }
      st = client->ReportProgress(step);
      if (!st.ok()) return Fail(rank, "report progress", st);
    }
    if (opts.verbose) {
      std::printf("STEP %d %llu\n", rank, static_cast<unsigned long long>(step));
      std::fflush(stdout);  // tests follow progress through a pipe
    }
  }
  if (client) {
    ftrun::Status st = client->Wait();
    if (!st.ok()) return Fail(rank, "wait", st);
  }
  if (refused_saves > 0) {
    std::printf("SAVE_FAILURES %d %llu\n", rank, static_cast<unsigned long long>(refused_saves));
  }
  std::printf("DIGEST %d %s\n", rank, trainer.Digest().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opts;
  std::string state_bytes = "64MiB";
  int local_rank = -1;
  CLI::App app{"ftrun-synthetic: a deterministic fake trainer for ftrun tests and benchmarks"};
  app.add_option("--state-bytes", state_bytes, "state size: 4096, 64MiB, 2G ...")->capture_default_str();
  app.add_option("--tensors", opts.tensors, "number of float32 tensors")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--steps", opts.steps, "last step (steps count from 1)")->capture_default_str();
  app.add_option("--change-fraction", opts.change_fraction, "share of the state changed per step")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--change-only-rank", opts.change_only_rank,
                 "only this rank's state changes (a one-way replication benchmark)");
  app.add_option("--change-mode", opts.change_mode, "scattered: 1 MiB blocks; tensors: whole ones")
      ->check(CLI::IsMember({"scattered", "tensors"}))
      ->capture_default_str();
  app.add_option("--step-ms", opts.step_ms, "emulated compute per step")->check(CLI::NonNegativeNumber);
  app.add_option("--crash-at-step", opts.crash_at_step, "crash at this step (generation 0 only)");
  app.add_option("--crash-mode", opts.crash_mode, "how to crash")
      ->check(CLI::IsMember({"kill", "segv", "exit", "hang", "abort"}))
      ->capture_default_str();
  app.add_option("--crash-rank", opts.crash_rank, "the rank that crashes")->capture_default_str();
  app.add_flag("--crash-during-save", opts.crash_during_save, "crash from a thread during Save");
  app.add_flag("--no-ftrun", opts.no_ftrun, "run without an agent (golden digest)");
  app.add_flag("--use-generations", opts.use_generations, "pass change generations to Save");
  app.add_flag("--verbose", opts.verbose, "print a STEP line per step");
  app.add_option("--rank", opts.rank, "rank (default: $FTRUN_RANK, else $RANK)");
  app.add_option("--local_rank", local_rank, "ignored (appended by launchers)");
  CLI11_PARSE(app, argc, argv);

  if (!ParseSize(state_bytes, &opts.state_bytes) || opts.state_bytes % 4 != 0 ||
      opts.state_bytes / 4 < static_cast<uint64_t>(opts.tensors)) {
    std::fprintf(stderr,
                 "ftrun-synthetic: --state-bytes '%s' must be a multiple of 4 bytes with at "
                 "least one float per tensor (e.g. 4096, 256MiB, 2G)\n",
                 state_bytes.c_str());
    return 2;
  }
  return Run(opts);
}
