// PersistWriter: round trip through the reader, dedup, multi-node markers,
// retries, cancel, rate limit (token math only, never wall-clock time); and
// at the end the scrub (ChunkScrubber) that repairs reused chunk files from
// RAM.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "plugin/persist/disk_format.h"
#include "plugin/persist/fault_env.h"
#include "plugin/persist/io_workers.h"
#include "plugin/persist/persist_reader.h"
#include "plugin/persist/rate_limiter.h"
#include "plugin/persist/retention.h"
#include "plugin/persist/scrub.h"
#include "tests/catch.h"
#include "tests/unit/persist_test_util.h"

namespace ftrun {
namespace {

std::vector<TensorSpec> Specs(uint64_t seed_w, uint64_t seed_b) {
  return {{"layer.w", 300000, seed_w}, {"layer.b", 1000, seed_b}, {"empty", 0, 0}};
}

int CountChunkFiles(const std::string& job_dir) {
  int n = 0;
  std::vector<std::string> subs, names;
  if (!PosixEnv()->ListDir(job_dir + "/chunks", &subs).ok()) return 0;
  for (const auto& s : subs) {
    REQUIRE(PosixEnv()->ListDir(job_dir + "/chunks/" + s, &names).ok());
    for (const auto& f : names) n += f.find(".tmp") == std::string::npos;
  }
  return n;
}

}  // namespace

TEST_CASE("a written version reads back exactly", "[persist][writer]") {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> ms = {bank.Build(0, 5, Specs(1, 2)), bank.Build(1, 5, Specs(3, 4))};
  PersistWriter w(WriterOptions(PosixEnv(), dir.path() + "/persist", "job", 2));
  Status st = w.WriteVersion(5, Ptrs(ms), bank.Source());
  INFO(st.ToString());
  REQUIRE(st.ok());
  PersistProgress p = w.Progress();
  CHECK(p.versions_written == 1);
  CHECK(p.chunks_written == 2 * (5 + 1));  // 300000 B = 5 chunks of 64 KiB, 1000 B = 1
  CHECK(p.chunk_bytes_written == 2 * 301000);
  CHECK(p.chunks_skipped == 0);
  CHECK(p.bytes_written > p.chunk_bytes_written + p.chunks_written * kChunkHeaderSize);

  PersistReader r(PosixEnv(), dir.path() + "/persist", "job", 2);
  std::vector<uint64_t> versions;
  REQUIRE(r.ListComplete(&versions).ok());
  CHECK(versions == std::vector<uint64_t>{5});
  std::vector<Manifest> back;
  REQUIRE(r.LoadVersion(5, nullptr, &back).ok());
  REQUIRE(back.size() == 2);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(back[rank].rank == rank);
    CHECK(back[rank].user_bytes == ms[rank].user_bytes);
    CHECK(CheckSameLayout(ms[rank], back[rank]).ok());
    for (size_t t = 0; t < back[rank].tensors.size(); ++t) {
      const auto& chunks = back[rank].tensors[t].chunks;
      REQUIRE(chunks.size() == ms[rank].tensors[t].chunks.size());
      for (size_t c = 0; c < chunks.size(); ++c) {
        CHECK(chunks[c].hash == ms[rank].tensors[t].chunks[c].hash);
        std::string bytes(chunks[c].length, '\0');
        REQUIRE(r.ReadChunk(chunks[c], bytes.data()).ok());
        CHECK(bytes == bank.Bytes(chunks[c].hash));
      }
    }
  }
  uint64_t checked = 0;
  REQUIRE(r.Verify(5, &checked).ok());
  CHECK(checked == 12);
}

TEST_CASE("a later version writes only the chunks that changed", "[persist][writer]") {
  ScratchDir dir;
  ChunkBank bank;
  PersistWriter w(WriterOptions(PosixEnv(), dir.path(), "job", 1));
  std::vector<Manifest> v1 = {bank.Build(0, 1, Specs(1, 2))};
  REQUIRE(w.WriteVersion(1, Ptrs(v1), bank.Source()).ok());
  CHECK(w.Progress().chunks_written == 6);

  // Version 2: the bias changes, the weight does not. Identical chunks in
  // one version (two tensors with the same bytes) are written once.
  std::vector<Manifest> v2 = {
      bank.Build(0, 2, {{"layer.w", 300000, 1}, {"layer.b", 1000, 99}, {"empty", 0, 0}, {"copy.b", 1000, 99}})};
  int reads_before = bank.reads();
  REQUIRE(w.WriteVersion(2, Ptrs(v2), bank.Source()).ok());
  PersistProgress p = w.Progress();
  CHECK(p.chunks_written == 7);
  CHECK(p.chunks_skipped == 5);
  CHECK(p.chunk_bytes_skipped == 300000);
  CHECK(bank.reads() - reads_before == 1);  // skipped chunks are never read
  CHECK(CountChunkFiles(dir.path() + "/job") == 7);

  PersistReader r(PosixEnv(), dir.path(), "job", 1);
  CHECK(r.Verify(1).ok());
  CHECK(r.Verify(2).ok());

  // A new writer (a restarted agent) skips what is on disk too.
  PersistWriter again(WriterOptions(PosixEnv(), dir.path(), "job", 1));
  std::vector<Manifest> v3 = {bank.Build(0, 3, Specs(1, 99))};
  REQUIRE(again.WriteVersion(3, Ptrs(v3), bank.Source()).ok());
  CHECK(again.Progress().chunks_written == 0);
  CHECK(again.Progress().chunks_skipped == 6);
}

TEST_CASE("writing a version this node already completed writes nothing", "[persist][writer]") {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> ms = {bank.Build(0, 4, Specs(1, 2))};
  PersistWriter w(WriterOptions(PosixEnv(), dir.path(), "job", 1));
  REQUIRE(w.WriteVersion(4, Ptrs(ms), bank.Source()).ok());
  uint64_t bytes = w.Progress().bytes_written;
  REQUIRE(w.WriteVersion(4, Ptrs(ms), bank.Source()).ok());
  CHECK(w.Progress().versions_already_complete == 1);
  CHECK(w.Progress().bytes_written == bytes);
}

TEST_CASE("a version number saved again with other contents is refused until discarded", "[persist][writer]") {
  ScratchDir dir;
  ChunkBank bank;
  PersistWriter w(WriterOptions(PosixEnv(), dir.path(), "job", 1));
  for (uint64_t v = 1; v <= 3; ++v) {
    std::vector<Manifest> ms = {bank.Build(0, v, Specs(v, 2))};
    REQUIRE(w.WriteVersion(v, Ptrs(ms), bank.Source()).ok());
  }
  // The job went back to version 1 (version 3 did not verify, say) and
  // trains on: its new version 3 has other bytes than the one on disk.
  std::vector<Manifest> again = {bank.Build(0, 3, Specs(33, 2))};
  Status st = w.WriteVersion(3, Ptrs(again), bank.Source());
  CHECK(st.code() == Code::kFailedPrecondition);
  CHECK(Contains(st.message(), "node0.COMPLETE already covers version 3 with other contents"));
  RetentionOptions o;
  o.dir = dir.path();
  o.job_id = "job";
  std::vector<uint64_t> deleted;
  REQUIRE(DiscardVersionsAbove(o, 1, &deleted).ok());
  CHECK(deleted == std::vector<uint64_t>({2, 3}));
  REQUIRE(w.WriteVersion(3, Ptrs(again), bank.Source()).ok());
  std::vector<Manifest> back;
  PersistReader r(PosixEnv(), dir.path(), "job", 1);
  REQUIRE(r.LoadVersion(3, nullptr, &back).ok());
  CHECK(back[0].tensors[0].chunks[0].hash == again[0].tensors[0].chunks[0].hash);
  CHECK(r.Verify(3).ok());
  std::vector<uint64_t> versions;
  REQUIRE(r.ListComplete(&versions).ok());
  CHECK(versions == std::vector<uint64_t>({3, 1}));
}

TEST_CASE("each node writes its ranks; a version is complete when markers cover all ranks", "[persist][writer]") {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> node0 = {bank.Build(0, 7, Specs(1, 2)), bank.Build(1, 7, Specs(3, 4))};
  std::vector<Manifest> node1 = {bank.Build(2, 7, Specs(1, 2)), bank.Build(3, 7, Specs(5, 6))};
  PersistWriter w0(WriterOptions(PosixEnv(), dir.path(), "job", 4, 0));
  PersistWriter w1(WriterOptions(PosixEnv(), dir.path(), "job", 4, 1));
  PersistReader r(PosixEnv(), dir.path(), "job", 4);

  REQUIRE(w0.WriteVersion(7, Ptrs(node0), bank.Source()).ok());
  std::vector<uint64_t> versions;
  std::vector<std::string> skipped;
  REQUIRE(r.ListComplete(&versions, &skipped).ok());
  CHECK(versions.empty());
  REQUIRE(skipped.size() == 1);
  CHECK(Contains(skipped[0], "version 7: "));
  CHECK(Contains(skipped[0], "no COMPLETE marker covers ranks 2, 3 yet (of world size 4)"));

  REQUIRE(w1.WriteVersion(7, Ptrs(node1), bank.Source()).ok());
  CHECK(w1.Progress().chunks_skipped == 6);  // rank 2 has rank 0's bytes, shared through the directory
  REQUIRE(r.ListComplete(&versions).ok());
  CHECK(versions == std::vector<uint64_t>{7});
  CHECK(r.Verify(7).ok());
}

TEST_CASE("bad arguments to WriteVersion name the problem", "[persist][writer]") {
  ScratchDir dir;
  ChunkBank bank;
  PersistWriter w(WriterOptions(PosixEnv(), dir.path(), "job", 2));
  std::vector<Manifest> wrong_version = {bank.Build(0, 3, Specs(1, 2))};
  CHECK(
      Contains(w.WriteVersion(4, Ptrs(wrong_version), bank.Source()).message(), "rank 0's manifest is for version 3"));
  std::vector<Manifest> outside = {bank.Build(2, 4, Specs(1, 2))};
  CHECK(Contains(w.WriteVersion(4, Ptrs(outside), bank.Source()).message(), "rank 2 is outside world size 2"));
  std::vector<Manifest> twice = {bank.Build(1, 4, Specs(1, 2)), bank.Build(1, 4, Specs(1, 2))};
  CHECK(Contains(w.WriteVersion(4, Ptrs(twice), bank.Source()).message(), "rank 1 given twice"));
  PersistWriter no_job(WriterOptions(PosixEnv(), dir.path(), "", 2));
  CHECK(no_job.WriteVersion(3, Ptrs(wrong_version), bank.Source()).code() == Code::kInvalidArgument);
}

TEST_CASE("bytes that do not match their hash are never written", "[persist][writer]") {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> ms = {bank.Build(0, 1, Specs(1, 2))};
  std::string rotten(1000, 'x');
  ChunkSource source = [&](const ChunkRef& ref, const void** data) {
    if (ref.length == 1000) return *data = rotten.data(), Status::Ok();  // a bit flip in RAM
    return bank.Source()(ref, data);
  };
  PersistWriter w(WriterOptions(PosixEnv(), dir.path(), "job", 1));
  Status st = w.WriteVersion(1, Ptrs(ms), source);
  CHECK(st.code() == Code::kCorruption);
  CHECK(Contains(st.message(), "rank 0 tensor 'layer.b' chunk #0"));
  CHECK(Contains(st.message(), "do not match their hash; not written"));
  CHECK_FALSE(PosixEnv()->FileExists(ChunkPath(dir.path() + "/job", ms[0].tensors[1].chunks[0].hash)));
  std::vector<uint64_t> versions;
  REQUIRE(PersistReader(PosixEnv(), dir.path(), "job", 1).ListComplete(&versions).ok());
  CHECK(versions.empty());
}

TEST_CASE("Cancel stops a write between chunks; a retry finishes it", "[persist][writer]") {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> ms = {bank.Build(0, 1, Specs(1, 2))};
  PersistWriter w(WriterOptions(PosixEnv(), dir.path(), "job", 1));
  int served = 0;
  ChunkSource source = [&](const ChunkRef& ref, const void** data) {
    if (++served == 2) w.Cancel();
    return bank.Source()(ref, data);
  };
  Status st = w.WriteVersion(1, Ptrs(ms), source);
  CHECK(st.code() == Code::kUnavailable);
  CHECK(Contains(st.message(), "stopped"));
  // The second chunk is never written; the first may be, if a worker got to
  // it before the Cancel.
  uint64_t before = w.Progress().chunks_written;
  CHECK(before <= 1);
  CHECK(w.WriteVersion(1, Ptrs(ms), bank.Source()).code() == Code::kUnavailable);  // sticky
  w.ClearCancel();
  REQUIRE(w.WriteVersion(1, Ptrs(ms), bank.Source()).ok());
  CHECK(w.Progress().chunks_written == 6);
  CHECK(w.Progress().chunks_skipped == before);  // what the first call wrote is kept
  CHECK(PersistReader(PosixEnv(), dir.path(), "job", 1).Verify(1).ok());
}

TEST_CASE("Cancel interrupts a rate-limit wait", "[persist][writer]") {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> ms = {bank.Build(0, 1, Specs(1, 2))};
  PersistWriterOptions o = WriterOptions(PosixEnv(), dir.path(), "job", 1);
  o.rate_limit = 1024;  // 1 KiB/s: the first chunk alone would take a minute
  o.burst = 1024;
  PersistWriter w(o);
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    w.Cancel();
  });
  Status st = w.WriteVersion(1, Ptrs(ms), bank.Source());
  canceller.join();
  CHECK(st.code() == Code::kUnavailable);
}

TEST_CASE("the token bucket's arithmetic", "[persist][writer]") {
  using namespace std::chrono;
  RateLimiter unlimited(0, 0);
  CHECK(unlimited.Debit(1ull << 40, steady_clock::time_point{}).count() == 0);

  RateLimiter r(1000000, 500000);  // 1 MB/s, 0.5 MB burst, starts full
  steady_clock::time_point t0{};
  CHECK(r.Debit(400000, t0).count() == 0);
  CHECK(r.tokens() == Approx(100000));
  CHECK(r.Debit(300000, t0) == nanoseconds(200000000));  // 200 KB short: 0.2 s
  // After the wait the debt is paid and nothing more is owed.
  CHECK(r.Debit(0, t0 + milliseconds(200)).count() == 0);
  CHECK(r.tokens() == Approx(0).margin(1e-3));
  // A long idle time refills only up to the burst.
  CHECK(r.Debit(0, t0 + seconds(100)).count() == 0);
  CHECK(r.tokens() == Approx(500000));
  CHECK(RateLimiter(100ull << 20, 0).burst() == (10ull << 20));  // default: 0.1 s worth
  CHECK(RateLimiter(1000, 0).burst() == (1ull << 20));           // at least 1 MiB
}

TEST_CASE("the writer paces every byte it writes at the rate limit", "[persist][writer]") {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> ms = {bank.Build(0, 1, {{"w", 3u << 20, 1}, {"b", 1000, 2}}, 1u << 20)};
  using namespace std::chrono;
  steady_clock::time_point now{};
  nanoseconds slept{0};
  PersistWriterOptions o = WriterOptions(PosixEnv(), dir.path(), "job", 1);
  o.rate_limit = 1u << 20;  // 1 MiB/s
  o.burst = 1u << 20;
  o.clock = [&] { return now; };
  o.sleep = [&](nanoseconds d) {
    slept += d;
    now += d;  // time passes only while the writer waits
  };
  PersistWriter w(o);
  REQUIRE(w.WriteVersion(1, Ptrs(ms), bank.Source()).ok());
  PersistProgress p = w.Progress();
  // Everything beyond the burst was paid for at exactly the rate.
  double expected_s = static_cast<double>(p.bytes_written - (1u << 20)) / (1u << 20);
  CHECK(duration<double>(slept).count() == Approx(expected_s).epsilon(1e-6));
  CHECK(p.throttle_ns == static_cast<uint64_t>(slept.count()));
  // Every byte appended is counted: chunk headers and bytes, manifest, marker.
  uint64_t manifest = 0, marker = 0;
  const std::string vdir = VersionDir(dir.path() + "/job", 1);
  REQUIRE(PosixEnv()->GetFileSize(vdir + "/rank0.manifest", &manifest).ok());
  REQUIRE(PosixEnv()->GetFileSize(vdir + "/node0.COMPLETE", &marker).ok());
  CHECK(p.chunks_written == 4);
  CHECK(p.bytes_written == 4 * kChunkHeaderSize + (3u << 20) + 1000 + manifest + marker);
}

}  // namespace ftrun

// ---------------------------------------------------------------------------
// The write pipeline: zero-copy appends, write threads handing files to sync
// threads, the I/O workers.

namespace ftrun {
namespace {

// Forwards to a base Env and records the calls that make a chunk durable;
// `on_sync` runs before a file's Sync (on the thread that syncs it).
class RecordingEnv : public Env {
 public:
  explicit RecordingEnv(Env* base) : base_(base) {}
  std::function<void(const std::string& path)> on_sync;

  std::vector<std::string> events() const {
    std::lock_guard<std::mutex> l(mu_);
    return events_;
  }
  int created(const std::string& substr) const {
    std::lock_guard<std::mutex> l(mu_);
    int n = 0;
    for (const auto& e : events_) n += e.rfind("create ", 0) == 0 && e.find(substr) != std::string::npos;
    return n;
  }

  Status NewWritableFile(const std::string& path, std::unique_ptr<WritableFile>* out) override {
    std::unique_ptr<WritableFile> f;
    FTRUN_RETURN_IF_ERROR(base_->NewWritableFile(path, &f));
    Record("create " + path);
    *out = std::make_unique<File>(this, std::move(f));
    return Status::Ok();
  }
  Status NewRandomAccessFile(const std::string& path, std::unique_ptr<RandomAccessFile>* out) override {
    return base_->NewRandomAccessFile(path, out);
  }
  Status CreateDir(const std::string& path, bool* created) override { return base_->CreateDir(path, created); }
  Status SyncDir(const std::string& path) override {
    FTRUN_RETURN_IF_ERROR(base_->SyncDir(path));
    Record("syncdir " + path);
    return Status::Ok();
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    FTRUN_RETURN_IF_ERROR(base_->RenameFile(from, to));
    Record("rename " + from + " " + to);
    return Status::Ok();
  }
  Status DeleteFile(const std::string& path) override { return base_->DeleteFile(path); }
  Status DeleteDir(const std::string& path) override { return base_->DeleteDir(path); }
  Status ListDir(const std::string& path, std::vector<std::string>* names) override {
    return base_->ListDir(path, names);
  }
  Status GetFileSize(const std::string& path, uint64_t* size) override { return base_->GetFileSize(path, size); }
  Status IsDirectory(const std::string& path, bool* is_dir) override { return base_->IsDirectory(path, is_dir); }

 private:
  class File : public WritableFile {
   public:
    File(RecordingEnv* env, std::unique_ptr<WritableFile> base) : env_(env), base_(std::move(base)) {}
    Status Append(const void* data, size_t n) override { return base_->Append(data, n); }
    Status Sync() override {
      if (env_->on_sync) env_->on_sync(path());
      FTRUN_RETURN_IF_ERROR(base_->Sync());
      env_->Record("sync " + path());
      return Status::Ok();
    }
    Status Close() override { return base_->Close(); }
    WriteMode mode() const override { return base_->mode(); }
    const std::string& path() const override { return base_->path(); }

   private:
    RecordingEnv* const env_;
    std::unique_ptr<WritableFile> base_;
  };
  void Record(std::string e) {
    std::lock_guard<std::mutex> l(mu_);
    events_.push_back(std::move(e));
  }

  Env* const base_;
  mutable std::mutex mu_;
  std::vector<std::string> events_;
};

// Page-aligned bytes, as the agent's arena hands them to the writer.
struct AlignedBytes {
  explicit AlignedBytes(size_t n, uint64_t seed) : size(n) {
    REQUIRE(posix_memalign(reinterpret_cast<void**>(&p), 4096, std::max<size_t>(n, 1)) == 0);
    std::string s = Pattern(seed, n);
    std::memcpy(p, s.data(), n);
  }
  ~AlignedBytes() { std::free(p); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  std::string str() const { return std::string(p, size); }
  char* p = nullptr;
  size_t size;
};

std::string ReadBack(Env* env, const std::string& path) {
  std::string bytes;
  REQUIRE(env->ReadFile(path, &bytes).ok());
  return bytes;
}

}  // namespace

TEST_CASE("aligned appends are written from the caller's memory and never touched after Append returns",
          "[persist][writer][zerocopy]") {
  using Refuse = PosixEnvOptions::RefuseDirect;
  PosixEnvOptions deflt, small, no_ring, refused, refused_small;
  small.buffer_size = 8192;  // a 1 MiB append is 128 pieces, 3 in flight at a time
  small.queue_depth = 3;
  no_ring.io_uring = false;                  // one O_DIRECT pwrite from the caller's memory
  refused.refuse_direct = Refuse::kAtWrite;  // the first direct write fails: buffered from then on
  refused_small = small;
  refused_small.refuse_direct = Refuse::kAtWrite;
  struct Case {
    const char* name;
    std::string base;
    PosixEnvOptions o;
  };
  for (const Case& c : {Case{"disk", "", deflt}, Case{"tmpfs", "/dev/shm", deflt}, Case{"small buffers", "", small},
                        Case{"pwrite", "", no_ring}, Case{"O_DIRECT refused at write", "", refused},
                        Case{"O_DIRECT refused at write, small buffers", "", refused_small}}) {
    SECTION(c.name) {
      ScratchDir dir(c.base);
      auto env = NewPosixEnv(c.o);
      // Each plan is a list of appends: (size, aligned source?), then the
      // file must hold exactly their bytes although every source was
      // scribbled over as soon as its Append returned.
      using Plan = std::vector<std::pair<size_t, bool>>;
      const std::vector<Plan> plans = {
          {{(1u << 20) + 4096, true}},                     // all zero copy
          {{4096, true}, {(3u << 20) + 1000, true}},       // a chunk file: header, then bytes and a tail
          {{100, false}, {1u << 20, true}, {4096, true}},  // buffered first: the rest is copied
          {{(1u << 20), true}, {0, true}, {5000, false}, {8192, true}},
          {{12288, true}, {12288, true}, {1, false}},
      };
      int n = 0;
      for (const Plan& plan : plans) {
        const std::string path = dir.path() + "/f" + std::to_string(n++);
        std::unique_ptr<WritableFile> f;
        REQUIRE(env->NewWritableFile(path, &f).ok());
        std::string expect;
        uint64_t seed = 1;
        for (const auto& [size, aligned] : plan) {
          AlignedBytes src(size + (aligned ? 0 : 1), seed++);
          const char* p = aligned ? src.p : src.p + 1;
          expect.append(p, size);
          Status st = f->Append(p, size);
          INFO(st.ToString());
          REQUIRE(st.ok());
          std::memset(src.p, 0xAB, src.size);  // the caller reuses its memory at once
        }
        REQUIRE(f->Sync().ok());
        REQUIRE(f->Close().ok());
        std::string got = ReadBack(env.get(), path);
        CHECK(got.size() == expect.size());
        CHECK(got == expect);
      }
    }
  }
}

TEST_CASE("a chunk's name appears only after its bytes are synced, and the marker after everything",
          "[persist][writer]") {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> ms = {bank.Build(0, 1, Specs(1, 2)), bank.Build(1, 1, Specs(3, 4))};
  RecordingEnv env(PosixEnv());
  PersistWriter w(WriterOptions(&env, dir.path(), "job", 2));
  REQUIRE(w.WriteVersion(1, Ptrs(ms), bank.Source()).ok());
  std::vector<std::string> ev = env.events();
  auto at = [&](const std::string& e) {
    auto it = std::find(ev.begin(), ev.end(), e);
    return it == ev.end() ? -1 : static_cast<int>(it - ev.begin());
  };
  int chunk_renames = 0, last_chunk_rename = -1, last_dir_sync_before_marker = -1;
  const std::string marker_tmp = TmpName(VersionDir(dir.path() + "/job", 1) + "/node0.COMPLETE", 0);
  const int marker_rename = at("rename " + marker_tmp + " " + VersionDir(dir.path() + "/job", 1) + "/node0.COMPLETE");
  REQUIRE(marker_rename >= 0);
  for (int i = 0; i < static_cast<int>(ev.size()); ++i) {
    const std::string& e = ev[i];
    if (e.rfind("syncdir ", 0) == 0 && i < marker_rename) last_dir_sync_before_marker = i;
    if (e.rfind("rename ", 0) != 0 || e.find("/chunks/") == std::string::npos) continue;
    const std::string tmp = e.substr(7, e.find(' ', 7) - 7);
    INFO(e);
    const int synced = at("sync " + tmp);
    CHECK(synced >= 0);
    CHECK(synced < i);
    ++chunk_renames;
    last_chunk_rename = i;
  }
  CHECK(chunk_renames == 12);
  CHECK(last_chunk_rename < last_dir_sync_before_marker);  // the directories are synced after the last name
  CHECK(at("sync " + marker_tmp) < marker_rename);
  CHECK(PersistReader(PosixEnv(), dir.path(), "job", 2).Verify(1).ok());
}

TEST_CASE("the next chunk files are written while one is being synced", "[persist][writer]") {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> ms = {bank.Build(0, 1, Specs(1, 2)), bank.Build(1, 1, Specs(3, 4))};  // 12 chunks
  RecordingEnv env(PosixEnv());
  std::atomic<bool> first{true}, overlapped{false};
  env.on_sync = [&](const std::string& path) {
    if (path.find("/chunks/") == std::string::npos || !first.exchange(false)) return;
    // Hold the first chunk's sync until three more chunk files exist (at most 10 s).
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline && env.created("/chunks/") < 4) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    overlapped = env.created("/chunks/") >= 4;
  };
  PersistWriter w(WriterOptions(&env, dir.path(), "job", 2));
  REQUIRE(w.WriteVersion(1, Ptrs(ms), bank.Source()).ok());
  CHECK(overlapped);
  CHECK(w.Progress().chunks_written == 12);
  CHECK(PersistReader(PosixEnv(), dir.path(), "job", 2).Verify(1).ok());
}

TEST_CASE("chunks from page-aligned memory round-trip, with I/O threads and without", "[persist][writer][zerocopy]") {
  for (int threads : {0, 1, 4}) {
    ScratchDir dir;
    // One rank, two tensors laid out in an aligned "arena" of 4 MiB chunks
    // (the last one short), as the agent's store hands them out.
    const size_t chunk = 4u << 20;
    AlignedBytes arena(3 * chunk + 12345, 42);
    Manifest m;
    m.rank = 0;
    m.version = 1;
    TensorManifest t;
    t.info = {"w", DType::kUInt8, {static_cast<int64_t>(arena.size)}, arena.size, Device::kHost};
    for (size_t off = 0; off < arena.size; off += chunk) {
      size_t len = std::min(chunk, arena.size - off);
      t.chunks.push_back({HashBytes(arena.p + off, len), len, off});
    }
    m.tensors.push_back(t);
    PersistWriterOptions o = WriterOptions(PosixEnv(), dir.path(), "job", 1);
    o.io_threads = threads;
    PersistWriter w(o);
    ChunkSource source = [&](const ChunkRef& ref, const void** data) {
      *data = arena.p + ref.offset;
      return Status::Ok();
    };
    std::vector<const Manifest*> ptrs = {&m};
    INFO("io_threads " << threads);
    REQUIRE(w.WriteVersion(1, ptrs, source).ok());
    CHECK(w.Progress().chunks_written == 4);
    PersistReader r(PosixEnv(), dir.path(), "job", 1);
    CHECK(r.Verify(1).ok());
    std::string back(t.chunks.back().length, '\0');
    REQUIRE(r.ReadChunk(t.chunks.back(), back.data()).ok());
    CHECK(back == std::string(arena.p + 3 * chunk, 12345));
  }
}

TEST_CASE("I/O workers: lower priority, jobs submitted from other workers, dropped jobs cleaned up",
          "[persist][writer]") {
  {
    IoWorkers w(2, 4, 19);
    std::atomic<int> nice{-100};
    REQUIRE(w.Submit([&] {
               errno = 0;
               nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
               return Status::Ok();
             }).ok());
    REQUIRE(w.Finish().ok());
    CHECK(nice == 19);
  }
  {
    // A job of one pool submits to another, as write workers hand files to
    // sync workers; after the first failure later jobs are destroyed unrun.
    IoWorkers second(2, 2);
    IoWorkers first(3, 2);
    std::atomic<int> ran{0};
    auto alive = std::make_shared<int>(0);
    for (int i = 0; i < 50; ++i) {
      Status st = first.Submit([&, i, alive] {
        return second.Submit([&, i, alive] {
          ++ran;
          return i == 10 ? Status::IoError("job 10 failed") : Status::Ok();
        });
      });
      if (!st.ok()) break;
    }
    Status a = first.Finish();
    Status b = second.Finish();
    CHECK(Contains(b.message(), "job 10 failed"));
    CHECK((a.ok() || Contains(a.message(), "job 10 failed")));
    CHECK(ran < 50);
    CHECK(alive.use_count() == 1);  // every job, run or dropped, was destroyed
  }
}

}  // namespace ftrun

// ---------------------------------------------------------------------------
// The scrub: chunk files a version reuses are read back once, and a bad one
// is rewritten from the RAM copy.

namespace ftrun {
namespace {

// Version 1 as an earlier agent wrote it, and version 2 of this agent: the
// weight (3 chunks of 64 KiB) is the same, the bias changed.
struct Reused {
  ChunkBank bank;
  std::vector<Manifest> v1 = {bank.Build(0, 1, {{"w", 150000, 1}, {"b", 1000, 2}})};
  std::vector<Manifest> v2 = {bank.Build(0, 2, {{"w", 150000, 1}, {"b", 1000, 3}})};
  const ChunkRef& Weight(size_t i) const { return v2[0].tensors[0].chunks[i]; }
};

std::string JobDir(const ScratchDir& dir) { return dir.path() + "/job"; }

// Counts the chunk files opened for reading; `on_open` runs first.
class ReadCountingEnv : public RecordingEnv {
 public:
  using RecordingEnv::RecordingEnv;
  std::function<void()> on_open;
  std::atomic<int> opened{0};
  Status NewRandomAccessFile(const std::string& path, std::unique_ptr<RandomAccessFile>* out) override {
    if (path.find("/chunks/") != std::string::npos) {
      if (on_open) on_open();
      ++opened;
    }
    return RecordingEnv::NewRandomAccessFile(path, out);
  }
};

bool NoTmpFiles(const std::string& job_dir) {
  std::vector<std::string> subs, names;
  if (!PosixEnv()->ListDir(ChunksDir(job_dir), &subs).ok()) return true;
  for (const auto& s : subs) {
    REQUIRE(PosixEnv()->ListDir(ChunksDir(job_dir) + "/" + s, &names).ok());
    for (const auto& f : names) {
      int node = 0;
      if (IsTmpName(f, &node)) return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("a bit flipped in a reused chunk file is repaired from RAM by the next write", "[persist][scrub]") {
  ScratchDir dir;
  FaultEnv env(PosixEnv());
  Reused r;
  REQUIRE(PersistWriter(WriterOptions(&env, dir.path(), "job", 1)).WriteVersion(1, Ptrs(r.v1), r.bank.Source()).ok());
  const std::string path = ChunkPath(JobDir(dir), r.Weight(1).hash);
  REQUIRE(env.FlipBitOnDisk(path, kChunkHeaderSize + 100, 2).ok());  // rots at rest
  PersistReader reader(&env, dir.path(), "job", 1);
  REQUIRE(reader.Verify(1).code() == Code::kCorruption);

  // The agent restarted: its writer reuses the weight's files.
  RecordingEnv rec(&env);
  PersistWriter w(WriterOptions(&rec, dir.path(), "job", 1));
  ChunkScrubber scrub(&w);
  REQUIRE(w.WriteVersion(2, Ptrs(r.v2), r.bank.Source()).ok());
  CHECK(w.Progress().chunks_skipped == 3);
  std::vector<ScrubFinding> found;
  Status st = scrub.Scrub(2, Ptrs(r.v2), r.bank.Source(), &found);
  INFO(st.ToString());
  REQUIRE(st.ok());
  REQUIRE(found.size() == 1);
  CHECK(found[0].path == path);
  CHECK(found[0].ref.hash == r.Weight(1).hash);
  CHECK(Contains(found[0].which, "rank 0 tensor 'w' chunk #1 (" + r.Weight(1).hash.ToHex() + ")"));
  CHECK(Contains(found[0].problem, "its bytes hash to "));
  CHECK_FALSE(Contains(found[0].problem, "no RAM holder"));  // this one had one
  CHECK(found[0].repair.ok());
  ScrubProgress p = scrub.Progress();
  CHECK(p.chunks_scrubbed == 3);  // the weight's; the bias was written by this write
  CHECK(p.bytes_scrubbed == 150000);
  CHECK(p.chunks_bad == 1);
  CHECK(p.chunks_repaired == 1);
  CHECK(p.repairs_failed == 0);

  // Crash-safe as a new chunk: tmp synced, renamed over the bad file, the
  // directory synced after the rename.
  const std::vector<std::string> ev = rec.events();
  auto at = [&](const std::string& e) { return std::find(ev.begin(), ev.end(), e) - ev.begin(); };
  const std::string tmp = TmpName(path, 0);
  const auto renamed = at("rename " + tmp + " " + path);
  REQUIRE(renamed < static_cast<long>(ev.size()));
  CHECK(at("sync " + tmp) < renamed);
  const std::string subdir_synced = "syncdir " + ChunkSubdir(JobDir(dir), r.Weight(1).hash);
  CHECK(std::find(ev.begin() + renamed, ev.end(), subdir_synced) != ev.end());
  CHECK(NoTmpFiles(JobDir(dir)));

  // Both versions verify again, so the newest one is restored.
  CHECK(reader.Verify(1).ok());
  CHECK(reader.Verify(2).ok());
  uint64_t version = 0;
  REQUIRE(reader.FindRestorable(nullptr, &version).ok());
  CHECK(version == 2);

  // Each chunk is checked once: a third version reusing everything reads nothing.
  std::vector<Manifest> v3 = {r.bank.Build(0, 3, {{"w", 150000, 1}, {"b", 1000, 3}})};
  REQUIRE(w.WriteVersion(3, Ptrs(v3), r.bank.Source()).ok());
  REQUIRE(scrub.Scrub(3, Ptrs(v3), r.bank.Source(), &found).ok());
  CHECK(found.empty());
  CHECK(scrub.Progress().chunks_scrubbed == 3);
}

TEST_CASE("chunks this writer wrote are not read back", "[persist][scrub]") {
  ScratchDir dir;
  ReadCountingEnv env(PosixEnv());
  Reused r;
  PersistWriter w(WriterOptions(&env, dir.path(), "job", 1));
  ChunkScrubber scrub(&w);
  std::vector<ScrubFinding> found;
  REQUIRE(w.WriteVersion(1, Ptrs(r.v1), r.bank.Source()).ok());
  REQUIRE(scrub.Scrub(1, Ptrs(r.v1), r.bank.Source(), &found).ok());
  REQUIRE(w.WriteVersion(2, Ptrs(r.v2), r.bank.Source()).ok());
  REQUIRE(scrub.Scrub(2, Ptrs(r.v2), r.bank.Source(), &found).ok());
  CHECK(env.opened == 0);
  CHECK(scrub.Progress().chunks_scrubbed == 0);
}

TEST_CASE("a bad header, a short file and a missing file are rewritten too", "[persist][scrub]") {
  ScratchDir dir;
  FaultEnv env(PosixEnv());
  Reused r;
  {
    PersistWriter first(WriterOptions(&env, dir.path(), "job", 1));
    REQUIRE(first.WriteVersion(1, Ptrs(r.v1), r.bank.Source()).ok());
    REQUIRE(first.WriteVersion(2, Ptrs(r.v2), r.bank.Source()).ok());
  }
  const std::string path = ChunkPath(JobDir(dir), r.Weight(0).hash);
  std::string problem;
  SECTION("header") {
    REQUIRE(env.FlipBitOnDisk(path, 20, 0).ok());
    problem = "header checksum mismatch";
  }
  SECTION("short") {
    REQUIRE(truncate(path.c_str(), kChunkHeaderSize + 1000) == 0);
    problem = "expected " + std::to_string(kChunkHeaderSize + r.Weight(0).length);
  }
  SECTION("missing") {
    REQUIRE(PosixEnv()->DeleteFile(path).ok());
    problem = "is missing";
  }
  // A restarted agent writes version 2 again (its marker is there: nothing
  // is written) and scrubs all of it.
  PersistWriter w(WriterOptions(&env, dir.path(), "job", 1));
  ChunkScrubber scrub(&w);
  REQUIRE(w.WriteVersion(2, Ptrs(r.v2), r.bank.Source()).ok());
  CHECK(w.Progress().versions_already_complete == 1);
  std::vector<ScrubFinding> found;
  Status st = scrub.Scrub(2, Ptrs(r.v2), r.bank.Source(), &found);
  INFO(st.ToString());
  REQUIRE(st.ok());
  REQUIRE(found.size() == 1);
  CHECK(found[0].path == path);
  CHECK(Contains(found[0].problem, problem));
  CHECK(found[0].repair.ok());
  CHECK(scrub.Progress().chunks_scrubbed == 4);
  CHECK(scrub.Progress().chunks_repaired == 1);
  PersistReader reader(&env, dir.path(), "job", 1);
  CHECK(reader.Verify(1).ok());
  CHECK(reader.Verify(2).ok());
  std::string back(r.Weight(0).length, '\0');
  REQUIRE(reader.ReadChunk(r.Weight(0), back.data()).ok());
  CHECK(back == r.bank.Bytes(r.Weight(0).hash));
}

TEST_CASE("a RAM copy that does not match its hash is never written; the error names the file", "[persist][scrub]") {
  ScratchDir dir;
  FaultEnv env(PosixEnv());
  Reused r;
  REQUIRE(PersistWriter(WriterOptions(&env, dir.path(), "job", 1)).WriteVersion(1, Ptrs(r.v1), r.bank.Source()).ok());
  const std::string path = ChunkPath(JobDir(dir), r.Weight(2).hash);
  REQUIRE(env.FlipBitOnDisk(path, kChunkHeaderSize + 7, 5).ok());
  std::string on_disk;
  REQUIRE(env.ReadFile(path, &on_disk).ok());

  PersistWriter w(WriterOptions(&env, dir.path(), "job", 1));
  ChunkScrubber scrub(&w);
  std::string rotten = r.bank.Bytes(r.Weight(2).hash);
  rotten[3] ^= 1;  // a bit flip in RAM as well
  ChunkSource source = [&](const ChunkRef& ref, const void** data) {
    if (ref.hash == r.Weight(2).hash) return *data = rotten.data(), Status::Ok();
    return r.bank.Source()(ref, data);
  };
  REQUIRE(w.WriteVersion(2, Ptrs(r.v2), source).ok());
  std::vector<ScrubFinding> found;
  Status st = scrub.Scrub(2, Ptrs(r.v2), source, &found);
  CHECK(st.code() == Code::kCorruption);
  CHECK(Contains(st.message(), "chunk file '" + path + "' failed its check and cannot be repaired from RAM"));
  CHECK(Contains(st.message(), "rank 0 tensor 'w' chunk #2"));
  CHECK(Contains(st.message(), "do not match their hash; not written"));
  REQUIRE(found.size() == 1);
  CHECK(found[0].repair.code() == Code::kCorruption);
  CHECK(scrub.Progress().chunks_repaired == 0);
  CHECK(scrub.Progress().repairs_failed == 1);
  std::string after;
  REQUIRE(env.ReadFile(path, &after).ok());
  CHECK(after == on_disk);  // left as it was: not replaced by other wrong bytes
  CHECK(NoTmpFiles(JobDir(dir)));

  // The retry (the flusher's backoff) checks only what is not known good
  // and, with a good RAM copy, repairs it.
  REQUIRE(w.WriteVersion(2, Ptrs(r.v2), r.bank.Source()).ok());
  REQUIRE(scrub.Scrub(2, Ptrs(r.v2), r.bank.Source(), &found).ok());
  CHECK(scrub.Progress().chunks_scrubbed == 4);  // 3, then the bad one again
  CHECK(scrub.Progress().chunks_repaired == 1);
  CHECK(PersistReader(&env, dir.path(), "job", 1).Verify(2).ok());
}

TEST_CASE("a repair that fails on a full disk is reported, and a retry repairs", "[persist][scrub]") {
  ScratchDir dir;
  FaultEnv env(PosixEnv());
  Reused r;
  REQUIRE(PersistWriter(WriterOptions(&env, dir.path(), "job", 1)).WriteVersion(1, Ptrs(r.v1), r.bank.Source()).ok());
  const std::string path = ChunkPath(JobDir(dir), r.Weight(0).hash);
  REQUIRE(env.FlipBitOnDisk(path, kChunkHeaderSize + 65535, 7).ok());
  PersistWriter w(WriterOptions(&env, dir.path(), "job", 1));
  ChunkScrubber scrub(&w);
  REQUIRE(w.WriteVersion(2, Ptrs(r.v2), r.bank.Source()).ok());
  env.FailWrites(WriteFault{28, 1000});
  std::vector<ScrubFinding> found;
  Status st = scrub.Scrub(2, Ptrs(r.v2), r.bank.Source(), &found);
  CHECK(st.code() == Code::kIoError);
  CHECK(Contains(st.message(), "chunk file '" + path + "' failed its check and cannot be repaired from RAM"));
  CHECK(Contains(st.message(), "No space left on device"));
  CHECK(scrub.Progress().repairs_failed == 1);
  CHECK(NoTmpFiles(JobDir(dir)));
  env.ClearWriteFaults();
  REQUIRE(w.WriteVersion(2, Ptrs(r.v2), r.bank.Source()).ok());
  st = scrub.Scrub(2, Ptrs(r.v2), r.bank.Source(), &found);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(scrub.Progress().chunks_repaired == 1);
  CHECK(PersistReader(&env, dir.path(), "job", 1).Verify(2).ok());
}

TEST_CASE("a scrub stops promptly when cancelled or stopped", "[persist][scrub]") {
  using namespace std::chrono;
  ScratchDir dir;
  ChunkBank bank;
  // 40 chunks of 64 KiB on disk, written by an earlier agent.
  std::vector<Manifest> v1 = {bank.Build(0, 1, {{"w", 40u << 16, 7}})};
  REQUIRE(PersistWriter(WriterOptions(PosixEnv(), dir.path(), "job", 1)).WriteVersion(1, Ptrs(v1), bank.Source()).ok());

  SECTION("Cancel during a rate-limit wait") {
    PersistWriterOptions o = WriterOptions(PosixEnv(), dir.path(), "job", 1);
    o.rate_limit = 1024;  // 1 KiB/s: reading every chunk back would take 45 minutes
    o.burst = 1024;
    PersistWriter w(o);
    ChunkScrubber scrub(&w);
    REQUIRE(w.WriteVersion(1, Ptrs(v1), bank.Source()).ok());  // complete already: nothing paced
    std::thread canceller([&] {
      std::this_thread::sleep_for(milliseconds(50));
      w.Cancel();
    });
    std::vector<ScrubFinding> found;
    Status st = scrub.Scrub(1, Ptrs(v1), bank.Source(), &found);
    canceller.join();
    CHECK(st.code() == Code::kUnavailable);
    CHECK(Contains(st.message(), "scrubbing the chunk files of version 1"));
    CHECK(Contains(st.message(), "stopped (cancelled)"));
    // Returned before reading more than the chunk in flight: at 1 KiB/s the
    // rest would take 45 minutes (no wall-clock bound asserted: the count says it).
    CHECK(scrub.Progress().chunks_scrubbed <= 1);
  }
  SECTION("Stop during a rate-limit wait (the flusher's Drain)") {
    PersistWriterOptions o = WriterOptions(PosixEnv(), dir.path(), "job", 1);
    o.rate_limit = 1024;
    o.burst = 1024;
    PersistWriter w(o);
    ChunkScrubber scrub(&w);
    REQUIRE(w.WriteVersion(1, Ptrs(v1), bank.Source()).ok());
    std::thread stopper([&] {
      std::this_thread::sleep_for(milliseconds(50));
      scrub.Stop();
    });
    std::vector<ScrubFinding> found;
    Status st = scrub.Scrub(1, Ptrs(v1), bank.Source(), &found);
    stopper.join();
    CHECK(st.code() == Code::kUnavailable);
    CHECK(Contains(st.message(), "stopped (asked to stop)"));
    CHECK(scrub.Progress().chunks_scrubbed <= 1);
    CHECK_FALSE(w.cancelled());  // the writer itself goes on
  }
  for (bool cancel : {true, false}) {
    DYNAMIC_SECTION((cancel ? "Cancel" : "Stop") << " while the I/O threads read") {
      ReadCountingEnv env(PosixEnv());
      PersistWriter w(WriterOptions(&env, dir.path(), "job", 1));
      ChunkScrubber scrub(&w);
      env.on_open = [&] {
        if (env.opened == 2) cancel ? w.Cancel() : scrub.Stop();
      };
      REQUIRE(w.WriteVersion(1, Ptrs(v1), bank.Source()).ok());
      std::vector<ScrubFinding> found;
      Status st = scrub.Scrub(1, Ptrs(v1), bank.Source(), &found);
      CHECK(st.code() == Code::kUnavailable);
      CHECK(found.empty());
      // Reads already started finish; nothing queued after the cancel is read.
      CHECK(env.opened <= 2 + w.options().io_threads);
      CHECK(scrub.Progress().chunks_scrubbed < 40);
      // The chunks not checked are checked by the next scrub.
      w.ClearCancel();
      scrub.Resume();
      env.on_open = nullptr;
      REQUIRE(scrub.Scrub(1, Ptrs(v1), bank.Source(), &found).ok());
      CHECK(scrub.Progress().chunks_scrubbed == 40);
    }
  }
}

}  // namespace ftrun
