// cuda_save_test: the CUDA save path end to end, on a real GPU and a real
// agent. Run plainly, it starts <build>/ftrun-agent with itself as the one
// rank (--rank-mode) and returns the agent's exit code. The rank saves CUDA
// and host tensors four times, checks from SaveStats that only changed
// chunks were copied, then restores the latest version with Read and
// ReadToDevice and compares with the live memory.
//
// Exit codes: 0 passed, 1 failed, 77 skipped (no usable CUDA device; CTest's
// SKIP_RETURN_CODE), anything else: the agent's own failure.
#include <cuda_runtime.h>
#include <limits.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ftrun/client.h"

namespace {

constexpr int kSkip = 77;
constexpr int kCommitTimeoutMs = 60000;

bool HaveDevice(std::string* why) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    *why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  else if (count == 0)
    *why = "cudaGetDeviceCount found 0 devices";
  return e == cudaSuccess && count > 0;
}

int Fail(const std::string& what) {
  std::printf("CUDA SAVE TEST FAILED: %s\n", what.c_str());
  std::fflush(stdout);
  return 1;
}

// Keeps the first failure; later checks are skipped once one failed.
struct Checker {
  std::string failure;
  bool ok() const { return failure.empty(); }
  void Expect(bool cond, const std::string& what) {
    if (ok() && !cond) failure = what;
  }
  void Cuda(cudaError_t e, const std::string& what) { Expect(e == cudaSuccess, what + ": " + cudaGetErrorString(e)); }
  void Ftrun(const ftrun::Status& s, const std::string& what) { Expect(s.ok(), what + ": " + s.ToString()); }
};

uint64_t ChunkLen(uint64_t nbytes, uint64_t chunk_size, uint64_t j) {
  return std::min(chunk_size, nbytes - j * chunk_size);
}

std::vector<char> ToHost(Checker* c, const void* dev, uint64_t n) {
  std::vector<char> out(n);
  c->Cuda(cudaMemcpy(out.data(), dev, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return out;
}

std::string Describe(const ftrun::SaveStats& s) {
  return "copied " + std::to_string(s.bytes_copied) + " bytes in " + std::to_string(s.chunks_copied) +
         " chunks, skipped " + std::to_string(s.chunks_skipped) + ", unchanged " + std::to_string(s.chunks_unchanged) +
         " of " + std::to_string(s.chunks_total);
}

int RankMain() {
  std::string why;
  if (!HaveDevice(&why)) {
    std::printf("SKIPPED: no usable CUDA device (%s)\n", why.c_str());
    return kSkip;
  }
  std::unique_ptr<ftrun::Client> client;
  ftrun::Status st = ftrun::Client::Connect(ftrun::ClientOptions{}, &client);
  if (!st.ok()) return Fail("Connect: " + st.ToString());
  const uint64_t cs = client->chunk_size();
  Checker c;

  // a, b: 10 MiB float32 from cudaMalloc (256-byte aligned). odd: a view 3
  // bytes into a buffer, one chunk plus a tail that is not a multiple of 16,
  // for the kernel's unaligned and tail paths. h: a host tensor.
  const uint64_t big = 10ull << 20, odd_bytes = cs + 4099, host_bytes = 1ull << 20;
  std::mt19937 rng(42);
  std::vector<char> pattern(std::max(big, odd_bytes + 16));
  for (auto& x : pattern) x = static_cast<char>(rng());
  char *a = nullptr, *b = nullptr, *odd_buf = nullptr;
  c.Cuda(cudaMalloc(&a, big), "cudaMalloc a");
  c.Cuda(cudaMalloc(&b, big), "cudaMalloc b");
  c.Cuda(cudaMalloc(&odd_buf, odd_bytes + 3), "cudaMalloc odd");
  if (!c.ok()) return Fail(c.failure);
  c.Cuda(cudaMemcpy(a, pattern.data(), big, cudaMemcpyHostToDevice), "fill a");
  std::reverse(pattern.begin(), pattern.end());
  c.Cuda(cudaMemcpy(b, pattern.data(), big, cudaMemcpyHostToDevice), "fill b");
  c.Cuda(cudaMemcpy(odd_buf, pattern.data() + 7, odd_bytes + 3, cudaMemcpyHostToDevice), "fill odd");
  std::vector<int32_t> h(host_bytes / 4);
  for (auto& x : h) x = static_cast<int32_t>(rng());
  char* odd = odd_buf + 3;

  auto ref = [](const char* name, ftrun::DType dtype, const void* p, uint64_t n, ftrun::Device dev) {
    ftrun::TensorRef t;
    t.name = name;
    t.dtype = dtype;
    t.shape = {static_cast<int64_t>(n / ftrun::DTypeSize(dtype))};
    t.data = p;
    t.nbytes = n;
    t.device = dev;
    return t;
  };
  std::vector<ftrun::TensorRef> tensors = {
      ref("a", ftrun::DType::kFloat32, a, big, ftrun::Device::kCuda),
      ref("b", ftrun::DType::kFloat32, b, big, ftrun::Device::kCuda),
      ref("odd", ftrun::DType::kUInt8, odd, odd_bytes, ftrun::Device::kCuda),
      ref("h", ftrun::DType::kInt32, h.data(), host_bytes, ftrun::Device::kHost),
  };
  auto save = [&](uint64_t v, ftrun::SaveStats* s) {
    c.Ftrun(client->Save(v, tensors, "step=" + std::to_string(v), s), "Save v" + std::to_string(v));
    c.Ftrun(client->Wait(), "Wait after v" + std::to_string(v));
    c.Ftrun(client->WaitCommitted(v, kCommitTimeoutMs), "WaitCommitted v" + std::to_string(v));
  };

  // A host pointer passed as CUDA memory is refused before anything is sent.
  {
    std::vector<ftrun::TensorRef> wrong = {
        ref("a", ftrun::DType::kFloat32, h.data(), host_bytes, ftrun::Device::kCuda)};
    ftrun::Status s = client->Save(1, wrong, "", nullptr);
    c.Expect(s.code() == ftrun::Code::kInvalidArgument, "a host pointer saved as CUDA memory gave " + s.ToString());
  }

  // v1: everything is new.
  ftrun::SaveStats s1;
  save(1, &s1);
  c.Expect(s1.bytes_copied == s1.bytes_total && s1.chunks_copied == s1.chunks_total, "v1: " + Describe(s1));

  // v2: one chunk of a changes, so exactly that chunk is copied. a gets a
  // generation so v3 can skip it.
  const uint64_t ja = big > cs ? 1 : 0;
  c.Cuda(cudaMemset(a + ja * cs, 0x5a, ChunkLen(big, cs, ja)), "cudaMemset a");
  tensors[0].generation = 5;
  ftrun::SaveStats s2;
  save(2, &s2);
  c.Expect(s2.chunks_copied == 1 && s2.bytes_copied == ChunkLen(big, cs, ja),
           "v2 (one chunk of a changed): " + Describe(s2));
  // Held open (pinned) to be read after v3: see v4.
  std::unique_ptr<ftrun::Snapshot> old;
  c.Ftrun(client->Load(2, &old), "Load v2");
  if (!c.ok()) return Fail(c.failure);

  // v3: a is skipped by generation; one float in b's first chunk and the
  // last byte of odd (its short tail chunk) change.
  const float f = 12345.5f;
  c.Cuda(cudaMemcpy(b + 4 * 1000, &f, sizeof f, cudaMemcpyHostToDevice), "poke b");
  char last = 0;
  c.Cuda(cudaMemcpy(&last, odd + odd_bytes - 1, 1, cudaMemcpyDeviceToHost), "peek odd");
  last = static_cast<char>(~last);
  c.Cuda(cudaMemcpy(odd + odd_bytes - 1, &last, 1, cudaMemcpyHostToDevice), "poke odd");
  ftrun::SaveStats s3;
  save(3, &s3);
  const uint64_t a_chunks = (big + cs - 1) / cs, odd_last = (odd_bytes - 1) / cs;
  c.Expect(s3.chunks_skipped == a_chunks && s3.chunks_copied == 2 &&
               s3.bytes_copied == ChunkLen(big, cs, 0) + ChunkLen(odd_bytes, cs, odd_last),
           "v3 (b chunk 0 and odd's tail changed, a skipped): " + Describe(s3));

  // v4: nothing changed on the GPU, but reading b from v2 told the client
  // b's chunk 0 is v2's. The fingerprint still matches v3's, so only the
  // saver's check of the chunk id catches it: that chunk must be copied.
  std::vector<char> scratch(big);
  c.Ftrun(old->Read("b", scratch.data(), big), "Read b from v2");
  old.reset();
  ftrun::SaveStats s4;
  save(4, &s4);
  c.Expect(s4.chunks_copied == 1 && s4.bytes_copied == ChunkLen(big, cs, 0),
           "v4 (b's chunk 0 known as v2's): " + Describe(s4));
  if (!c.ok()) return Fail(c.failure);

  // Restore the latest version and compare with what is live.
  std::unique_ptr<ftrun::Snapshot> snap;
  st = client->Load(ftrun::Client::kLatest, &snap);
  if (!st.ok()) return Fail("Load: " + st.ToString());
  c.Expect(snap->version() == 4 && snap->user_bytes() == "step=4",
           "Load gave version " + std::to_string(snap->version()) + " '" + snap->user_bytes() + "'");
  for (const ftrun::TensorRef& t : tensors) {
    const std::vector<char> live =
        t.device == ftrun::Device::kCuda
            ? ToHost(&c, t.data, t.nbytes)
            : std::vector<char>(static_cast<const char*>(t.data), static_cast<const char*>(t.data) + t.nbytes);
    std::vector<char> read(t.nbytes);
    c.Ftrun(snap->Read(t.name, read.data(), t.nbytes), "Read " + t.name);
    c.Expect(read == live, "Read '" + t.name + "' differs from the live tensor");
    void* dev = nullptr;
    c.Cuda(cudaMalloc(&dev, t.nbytes), "cudaMalloc restore buffer");
    if (!c.ok()) break;
    c.Ftrun(snap->ReadToDevice(t.name, dev, t.nbytes), "ReadToDevice " + t.name);
    c.Expect(ToHost(&c, dev, t.nbytes) == live, "ReadToDevice '" + t.name + "' differs from the live tensor");
    (void)cudaFree(dev);
  }
  snap.reset();
  (void)cudaFree(a);
  (void)cudaFree(b);
  (void)cudaFree(odd_buf);
  if (!c.ok()) return Fail(c.failure);
  std::printf("CUDA SAVE TEST OK (v1 %s; v2 %s; v3 %s; v4 %s)\n", Describe(s1).c_str(), Describe(s2).c_str(),
              Describe(s3).c_str(), Describe(s4).c_str());
  return 0;
}

// Runs <build>/ftrun-agent with this binary (in <build>/tests/) as its rank.
int RunUnderAgent() {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return Fail(std::string("readlink /proc/self/exe: ") + std::strerror(errno));
  self[n] = '\0';
  const std::string agent = (std::filesystem::path(self).parent_path().parent_path() / "ftrun-agent").string();
  if (::access(agent.c_str(), X_OK) != 0) return Fail("no ftrun-agent at " + agent);
  char dir[] = "/tmp/ftrun-cuda-test-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return Fail(std::string("mkdtemp: ") + std::strerror(errno));
  // No restarts: a failed rank should fail the test, not rerun against the
  // versions it already saved. A small store keeps the host registration cheap.
  const std::string config = std::string(dir) + "/ftrun.yaml";
  std::ofstream(config) << "job:\n  max_restarts: 0\nstore:\n  memory_budget: 256MiB\n";
  std::vector<std::string> args = {
      agent,       "--config", config,        "--nproc",         "1",  "--job-id", "cuda-test",
      "--run-dir", dir,        "--no_python", "--no_local_rank", "--", self,       "--rank-mode"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) return Fail(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::execv(agent.c_str(), argv.data());
    std::fprintf(stderr, "exec %s: %s\n", agent.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code != 0 && code != kSkip) std::printf("CUDA SAVE TEST FAILED: ftrun-agent exited with %d\n", code);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  const bool rank_mode =
      (argc > 1 && std::strcmp(argv[1], "--rank-mode") == 0) || std::getenv("FTRUN_AGENT_SOCKET") != nullptr;
  if (rank_mode) return RankMain();
  std::string why;
  if (!HaveDevice(&why)) {
    std::printf("SKIPPED: no usable CUDA device (%s)\n", why.c_str());
    return kSkip;
  }
  return RunUnderAgent();
}
