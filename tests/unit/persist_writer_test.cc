// PersistWriter: round trip through the reader, dedup, multi-node markers,
// retries, cancel, rate limit (token math only, never wall-clock time).
#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "plugin/persist/disk_format.h"
#include "plugin/persist/persist_reader.h"
#include "plugin/persist/rate_limiter.h"
#include "plugin/persist/retention.h"
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
