// Retention: which versions and chunks go, and which never do.
#include <unistd.h>

#include <cstdio>

#include "plugin/persist/disk_format.h"
#include "plugin/persist/persist_reader.h"
#include "plugin/persist/retention.h"
#include "tests/catch.h"
#include "tests/unit/persist_test_util.h"

namespace ftrun {
namespace {

// Writes versions first..last of a one-rank job; each changes the bias and
// keeps the weight.
void WriteVersions(ChunkBank* bank, const std::string& root, uint64_t first, uint64_t last) {
  PersistWriter w(WriterOptions(PosixEnv(), root, "job", 1));
  for (uint64_t v = first; v <= last; ++v) {
    std::vector<Manifest> ms = {bank->Build(0, v, {{"w", 100000, 1}, {"b", 1000, 100 + v}})};
    REQUIRE(w.WriteVersion(v, Ptrs(ms), bank->Source()).ok());
  }
}

std::vector<uint64_t> OnDisk(const std::string& root) {
  std::vector<uint64_t> versions;
  REQUIRE(ListVersions(PosixEnv(), root + "/job", &versions).ok());
  return versions;
}

RetentionOptions Options(const std::string& root, int keep) {
  RetentionOptions o;
  o.dir = root;
  o.job_id = "job";
  o.keep = keep;
  return o;
}

void RemoveMarker(const std::string& root, uint64_t v) {
  REQUIRE(PosixEnv()->DeleteFile(VersionDir(root + "/job", v) + "/node0.COMPLETE").ok());
}

}  // namespace

TEST_CASE("retention keeps the newest n complete versions and their chunks", "[persist][retention]") {
  ScratchDir dir;
  ChunkBank bank;
  WriteVersions(&bank, dir.path(), 1, 5);
  RetentionResult result;
  REQUIRE(ApplyRetention(Options(dir.path(), 2), &result).ok());
  CHECK(result.kept == std::vector<uint64_t>({5, 4}));
  CHECK(result.deleted == std::vector<uint64_t>({1, 2, 3}));
  CHECK(result.chunks_deleted == 3);  // the biases of 1..3; the weight is shared
  CHECK(result.bytes_freed == 3 * (kChunkHeaderSize + 1000));
  CHECK(result.gc_skipped.empty());
  CHECK(OnDisk(dir.path()) == std::vector<uint64_t>({4, 5}));
  PersistReader r(PosixEnv(), dir.path(), "job", 1);
  CHECK(r.Verify(4).ok());
  CHECK(r.Verify(5).ok());
  // Nothing more to do the second time.
  REQUIRE(ApplyRetention(Options(dir.path(), 2), &result).ok());
  CHECK(result.deleted.empty());
  CHECK(result.chunks_deleted == 0);
}

TEST_CASE("retention never deletes the version the job would restore from", "[persist][retention]") {
  ScratchDir dir;
  ChunkBank bank;
  WriteVersions(&bank, dir.path(), 1, 4);
  RetentionOptions o = Options(dir.path(), 1);
  o.protect = 2;
  RetentionResult result;
  REQUIRE(ApplyRetention(o, &result).ok());
  CHECK(result.kept == std::vector<uint64_t>({4, 2}));
  CHECK(result.deleted == std::vector<uint64_t>({1, 3}));
  CHECK(PersistReader(PosixEnv(), dir.path(), "job", 1).Verify(2).ok());
}

TEST_CASE("retention deletes only once a newer version is complete", "[persist][retention]") {
  ScratchDir dir;
  ChunkBank bank;
  WriteVersions(&bank, dir.path(), 1, 3);
  RemoveMarker(dir.path(), 3);  // version 3 is being written (or was abandoned)
  RetentionResult result;
  REQUIRE(ApplyRetention(Options(dir.path(), 1), &result).ok());
  CHECK(result.kept == std::vector<uint64_t>{2});
  CHECK(result.deleted == std::vector<uint64_t>{1});
  CHECK(OnDisk(dir.path()) == std::vector<uint64_t>({2, 3}));  // newer than any complete one: stays
  CHECK(PosixEnv()->FileExists(
      ChunkPath(dir.path() + "/job", bank.Build(0, 3, {{"b", 1000, 103}}).tensors[0].chunks[0].hash)));

  // Once version 4 is complete, the unfinished 3 is abandoned and goes.
  WriteVersions(&bank, dir.path(), 4, 4);
  REQUIRE(ApplyRetention(Options(dir.path(), 1), &result).ok());
  CHECK(result.deleted == std::vector<uint64_t>({2, 3}));
  CHECK(OnDisk(dir.path()) == std::vector<uint64_t>{4});
}

TEST_CASE("retention with no complete version deletes nothing", "[persist][retention]") {
  ScratchDir dir;
  ChunkBank bank;
  WriteVersions(&bank, dir.path(), 1, 2);
  RemoveMarker(dir.path(), 1);
  RemoveMarker(dir.path(), 2);
  RetentionResult result;
  REQUIRE(ApplyRetention(Options(dir.path(), 1), &result).ok());
  CHECK(result.deleted.empty());
  CHECK(result.chunks_deleted == 0);
  CHECK(OnDisk(dir.path()) == std::vector<uint64_t>({1, 2}));
  CHECK(ApplyRetention(Options(dir.path(), 0), &result).code() == Code::kInvalidArgument);
  REQUIRE(ApplyRetention(Options(dir.path() + "/nothing-here", 1), &result).ok());
}

TEST_CASE("chunk collection is skipped when a manifest cannot be read", "[persist][retention]") {
  ScratchDir dir;
  ChunkBank bank;
  WriteVersions(&bank, dir.path(), 1, 3);
  RemoveMarker(dir.path(), 3);
  const std::string m3 = VersionDir(dir.path() + "/job", 3) + "/rank0.manifest";
  REQUIRE(truncate(m3.c_str(), 10) == 0);
  RetentionResult result;
  REQUIRE(ApplyRetention(Options(dir.path(), 1), &result).ok());
  CHECK(result.deleted == std::vector<uint64_t>{1});
  CHECK(result.chunks_deleted == 0);
  CHECK(Contains(result.gc_skipped, "version 3: persist file '" + m3 + "'"));
}

TEST_CASE("retention removes this node's tmp files, not other nodes'", "[persist][retention]") {
  ScratchDir dir;
  ChunkBank bank;
  WriteVersions(&bank, dir.path(), 1, 1);
  const std::string sub = dir.path() + "/job/chunks/00";
  REQUIRE(PosixEnv()->CreateDir(sub).ok());
  for (const char* name : {"x.n0.tmp", "x.n1.tmp"}) {
    std::unique_ptr<WritableFile> f;
    REQUIRE(PosixEnv()->NewWritableFile(sub + "/" + name, &f).ok());
    REQUIRE(f->Close().ok());
  }
  RetentionResult result;
  REQUIRE(ApplyRetention(Options(dir.path(), 1), &result).ok());
  CHECK_FALSE(PosixEnv()->FileExists(sub + "/x.n0.tmp"));
  CHECK(PosixEnv()->FileExists(sub + "/x.n1.tmp"));
  CHECK(result.chunks_deleted == 0);
}

}  // namespace ftrun
