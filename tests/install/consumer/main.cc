// A rank that uses only the installed public API (include/ftrun/client.h),
// run under the installed ftrun-agent by tests/install/test_install_tree.py.
//
//   consumer STEPS KILL_AT
//
// Saves a state that is a pure function of the step, every step. In its
// first generation it waits for KILL_AT to be committed and SIGKILLs
// itself; the restarted rank loads the version the agent hands it, checks
// every byte and the user bytes, and trains on to STEPS. Prints
// "RESUMED <version>" after a restore and "CONSUMER DONE <rank>" at the end;
// any mismatch is an error exit with the reason.
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ftrun/client.h"

namespace {

constexpr size_t kWords = 1 << 18;  // 1 MiB of uint32

std::vector<uint32_t> StateAt(uint64_t step, int rank) {
  std::vector<uint32_t> w(kWords);
  for (size_t i = 0; i < kWords; ++i) {
    // Mostly unchanged from step to step (as weights are), one word in 4096 moves.
    w[i] = static_cast<uint32_t>(i * 2654435761u + static_cast<uint32_t>(rank)) ^
           (i % 4096 == step % 4096 ? static_cast<uint32_t>(step) : 0u);
  }
  return w;
}

int Fail(const std::string& what, const ftrun::Status& s = ftrun::Status::Ok()) {
  std::fprintf(stderr, "consumer: %s%s%s\n", what.c_str(), s.ok() ? "" : ": ", s.ok() ? "" : s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return Fail("usage: consumer STEPS KILL_AT");
  const uint64_t steps = std::strtoull(argv[1], nullptr, 10);
  const uint64_t kill_at = std::strtoull(argv[2], nullptr, 10);
  const char* gen = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const bool first_generation = gen == nullptr || std::string(gen) == "0";

  std::unique_ptr<ftrun::Client> client;
  ftrun::Status s = ftrun::Client::Connect(ftrun::ClientOptions{}, &client);
  if (!s.ok()) return Fail("connect", s);
  const int rank = client->rank();

  uint64_t start = 0, restore = 0;
  if (client->restore_version(&restore)) {
    std::unique_ptr<ftrun::Snapshot> snap;
    s = client->Load(restore, &snap);
    if (!s.ok()) return Fail("load " + std::to_string(restore), s);
    std::vector<uint32_t> back(kWords);
    s = snap->Read("w", back.data(), back.size() * sizeof(uint32_t));
    if (!s.ok()) return Fail("read w", s);
    if (back != StateAt(restore, rank)) return Fail("restored bytes of version " + std::to_string(restore) + " differ");
    if (snap->user_bytes() != "step " + std::to_string(restore)) return Fail("restored user bytes differ");
    std::printf("RESUMED %llu\n", static_cast<unsigned long long>(restore));
    start = restore + 1;
  }

  for (uint64_t step = start; step < steps; ++step) {
    std::vector<uint32_t> w = StateAt(step, rank);
    ftrun::TensorRef t;
    t.name = "w";
    t.dtype = ftrun::DType::kUInt32;
    t.shape = {static_cast<int64_t>(kWords)};
    t.data = w.data();
    t.nbytes = kWords * sizeof(uint32_t);
    s = client->Save(step, {t}, "step " + std::to_string(step));
    if (!s.ok()) return Fail("save " + std::to_string(step), s);
    if (first_generation && step == kill_at) {
      s = client->WaitCommitted(step, 30000);
      if (!s.ok()) return Fail("wait for commit of " + std::to_string(step), s);
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
  }
  // An expected failure comes back as a Status with its code, from the
  // installed library: a version going backwards.
  std::vector<uint32_t> w = StateAt(0, rank);
  ftrun::TensorRef t{"w", ftrun::DType::kUInt32, {static_cast<int64_t>(kWords)}, w.data(), kWords * 4};
  s = client->Save(0, {t}, "");
  if (s.code() != ftrun::Code::kFailedPrecondition) return Fail("a backwards save was not refused", s);
  std::printf("backwards save: %s (%s)\n", ftrun::CodeName(s.code()), ftrun::DTypeName(ftrun::DType::kUInt32));
  std::printf("CONSUMER DONE %d\n", rank);
  return 0;
}
