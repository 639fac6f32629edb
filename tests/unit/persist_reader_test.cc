// PersistReader: corruption is caught on read and skipped over on restore;
// snapshots of another job, world size or layout are refused by name.
#include "plugin/persist/persist_reader.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "plugin/persist/disk_format.h"
#include "plugin/persist/fault_env.h"
#include "plugin/persist/retention.h"
#include "plugin/persist/version_scan.h"
#include "tests/catch.h"
#include "tests/unit/persist_test_util.h"

namespace ftrun {
namespace {

// Versions 1 and 2 of a one-rank job "job" under `root`; version 2 changes
// the bias only.
struct Written {
  ChunkBank bank;
  std::vector<Manifest> v1, v2;
  Written(Env* env, const std::string& root, const std::string& job = "job", int world = 1) {
    for (int r = 0; r < world; ++r) {
      v1.push_back(bank.Build(r, 1, {{"w", 150000, 1}, {"b", 1000, 2}}));
      v2.push_back(bank.Build(r, 2, {{"w", 150000, 1}, {"b", 1000, 3}}));
    }
    PersistWriter w(WriterOptions(env, root, job, world));
    REQUIRE(w.WriteVersion(1, Ptrs(v1), bank.Source()).ok());
    REQUIRE(w.WriteVersion(2, Ptrs(v2), bank.Source()).ok());
  }
  const ChunkRef& Bias2() const { return v2[0].tensors[1].chunks[0]; }
};

}  // namespace

TEST_CASE("a bit flipped on disk is caught on read, and restore falls back", "[persist][reader]") {
  ScratchDir dir;
  FaultEnv env(PosixEnv());
  Written w(&env, dir.path());
  PersistReader r(&env, dir.path(), "job", 1);
  const std::string path = ChunkPath(dir.path() + "/job", w.Bias2().hash);
  REQUIRE(env.FlipBitOnDisk(path, kChunkHeaderSize + 500, 3).ok());

  std::string buf(1000, '\0');
  Status st = r.ReadChunk(w.Bias2(), buf.data());
  CHECK(st.code() == Code::kCorruption);
  CHECK(Contains(st.message(), "chunk file '" + path + "': its bytes hash to "));
  CHECK(Contains(st.message(), "expected " + w.Bias2().hash.ToHex() + " (corrupted on disk)"));
  // A restore reads from disk only what no RAM copy holds: its fallback says so.
  CHECK(Contains(st.message(), "the chunk had no RAM holder to repair it from"));
  CHECK_FALSE(Contains(r.CheckChunkFile(w.Bias2(), buf.data()).message(), "RAM"));

  st = r.Verify(2);
  CHECK(st.code() == Code::kCorruption);
  CHECK(Contains(st.message(), "version 2 rank 0 tensor 'b'"));
  CHECK(r.Verify(1).ok());

  uint64_t version = 0;
  std::vector<std::string> skipped;
  REQUIRE(r.FindRestorable(nullptr, &version, &skipped).ok());
  CHECK(version == 1);
  REQUIRE(skipped.size() == 1);
  CHECK(Contains(skipped[0], "version 2: "));
  CHECK(Contains(skipped[0], path));
  CHECK(Contains(skipped[0], "no RAM holder"));
}

TEST_CASE("a bit flipped in what a read returns is caught too", "[persist][reader]") {
  ScratchDir dir;
  FaultEnv env(PosixEnv());
  Written w(&env, dir.path());
  PersistReader r(&env, dir.path(), "job", 1);
  const ChunkRef& weight = w.v1[0].tensors[0].chunks[1];
  const std::string path = ChunkPath(dir.path() + "/job", weight.hash);
  std::string buf(weight.length, '\0');
  env.FlipBitOnRead(path, kChunkHeaderSize + 65535, 7);
  CHECK(r.ReadChunk(weight, buf.data()).code() == Code::kCorruption);
  uint64_t version = 0;
  std::vector<std::string> skipped;
  Status st = r.FindRestorable(nullptr, &version, &skipped);  // both versions share the chunk
  CHECK(st.code() == Code::kNotFound);
  CHECK(Contains(st.message(), "has no complete version of job 'job' that verifies"));
  CHECK(skipped.size() == 2);
  env.ClearReadFlips();
  REQUIRE(r.ReadChunk(weight, buf.data()).ok());
  CHECK(buf == w.bank.Bytes(weight.hash));

  env.FlipBitOnRead(path, 20, 0);  // in the header
  st = r.ReadChunk(weight, buf.data());
  CHECK(st.code() == Code::kCorruption);
  CHECK(Contains(st.message(), "header checksum mismatch"));
}

TEST_CASE("missing and truncated chunk files", "[persist][reader]") {
  ScratchDir dir;
  Written w(PosixEnv(), dir.path());
  PersistReader r(PosixEnv(), dir.path(), "job", 1);
  const std::string path = ChunkPath(dir.path() + "/job", w.Bias2().hash);
  std::string buf(1000, '\0');
  REQUIRE(truncate(path.c_str(), kChunkHeaderSize + 999) == 0);
  Status st = r.ReadChunk(w.Bias2(), buf.data());
  CHECK(st.code() == Code::kCorruption);
  CHECK(Contains(st.message(), "is 5095 bytes, expected 5096"));
  REQUIRE(PosixEnv()->DeleteFile(path).ok());
  st = r.ReadChunk(w.Bias2(), buf.data());
  CHECK(st.code() == Code::kNotFound);
  CHECK(Contains(st.message(), "chunk " + w.Bias2().hash.ToHex() + " is missing"));
  CHECK(Contains(st.message(), "no RAM holder"));
  uint64_t version = 0;
  REQUIRE(r.FindRestorable(nullptr, &version).ok());
  CHECK(version == 1);
}

TEST_CASE("versions with a bad or missing marker or manifest are skipped with the reason", "[persist][reader]") {
  ScratchDir dir;
  FaultEnv env(PosixEnv());
  Written w(&env, dir.path());
  PersistReader r(&env, dir.path(), "job", 1);
  const std::string v2 = VersionDir(dir.path() + "/job", 2);

  REQUIRE(env.FlipBitOnDisk(v2 + "/rank0.manifest", 40, 2).ok());
  std::vector<uint64_t> versions;
  std::vector<std::string> skipped;
  REQUIRE(r.ListComplete(&versions, &skipped).ok());
  CHECK(versions == std::vector<uint64_t>{1});
  REQUIRE(skipped.size() == 1);
  CHECK(Contains(skipped[0], "version 2: manifest '" + v2 + "/rank0.manifest'"));
  CHECK(Contains(skipped[0], "does not match its COMPLETE marker"));
  std::vector<Manifest> ms;
  Status st = r.LoadVersion(2, nullptr, &ms);
  CHECK(st.code() == Code::kNotFound);
  CHECK(Contains(st.message(), "version 2 is not complete: "));

  REQUIRE(env.FlipBitOnDisk(v2 + "/node0.COMPLETE", 30, 2).ok());
  skipped.clear();
  REQUIRE(r.ListComplete(&versions, &skipped).ok());
  CHECK(Contains(skipped.at(0), "COMPLETE marker checksum mismatch"));

  REQUIRE(env.DeleteFile(v2 + "/node0.COMPLETE").ok());
  skipped.clear();
  REQUIRE(r.ListComplete(&versions, &skipped).ok());
  CHECK(Contains(skipped.at(0), "has no COMPLETE marker (not finished)"));
  REQUIRE(env.CreateDir(dir.path() + "/job/not-a-version").ok());  // strays are ignored
  REQUIRE(r.ListComplete(&versions).ok());
  CHECK(versions == std::vector<uint64_t>{1});
}

TEST_CASE("a reader takes the version asked for or the newest complete one, naming what is there",
          "[persist][reader]") {
  ScratchDir dir;
  FaultEnv env(PosixEnv());
  Written w(&env, dir.path());
  VersionScan scan;
  REQUIRE(FindCompleteVersion(&env, dir.path(), "job", std::nullopt, &scan).ok());
  CHECK(scan.version == 2);
  REQUIRE(FindCompleteVersion(&env, dir.path(), "job", 1, &scan).ok());
  CHECK(scan.version == 1);

  Status st = FindCompleteVersion(&env, dir.path() + "/nope", "job", std::nullopt, &scan);
  CHECK(st.code() == Code::kNotFound);
  CHECK(Contains(st.message(), "persist dir '" + dir.path() + "/nope' does not exist"));
  st = FindCompleteVersion(&env, dir.path(), "other", std::nullopt, &scan);
  CHECK(Contains(st.message(), "has no job 'other'"));
  CHECK(Contains(st.message(), "jobs there: 'job'"));
  st = FindCompleteVersion(&env, dir.path(), "job", 7, &scan);
  CHECK(Contains(st.message(), "has no version 7"));
  CHECK(Contains(st.message(), "versions there, newest first: 2, 1"));

  // A newer version that is not complete: skipped by default, refused by name.
  const std::string v2 = VersionDir(dir.path() + "/job", 2);
  REQUIRE(env.FlipBitOnDisk(v2 + "/rank0.manifest", 40, 2).ok());
  REQUIRE(FindCompleteVersion(&env, dir.path(), "job", std::nullopt, &scan).ok());
  CHECK(scan.version == 1);
  st = FindCompleteVersion(&env, dir.path(), "job", 2, &scan);
  CHECK(st.code() == Code::kFailedPrecondition);
  CHECK(Contains(st.message(), "version 2 of job 'job' is not complete: manifest"));
  REQUIRE(env.FlipBitOnDisk(VersionDir(dir.path() + "/job", 1) + "/rank0.manifest", 40, 2).ok());
  st = FindCompleteVersion(&env, dir.path(), "job", std::nullopt, &scan);
  CHECK(st.code() == Code::kNotFound);
  CHECK(Contains(st.message(), "has no complete version; version 2: manifest"));
}

TEST_CASE("a snapshot of another job or world size is refused by name", "[persist][reader]") {
  ScratchDir dir;
  Written w(PosixEnv(), dir.path(), "a", 2);
  std::vector<Manifest> ms;

  Status st = PersistReader(PosixEnv(), dir.path(), "a", 4).LoadVersion(2, nullptr, &ms);
  CHECK(st.code() == Code::kFailedPrecondition);
  CHECK(st.message() == "persist dir '" + dir.path() +
                            "': version 2 was written by job 'a' with world size 2; this job is 'a' with world size 4");
  uint64_t version = 0;
  CHECK(PersistReader(PosixEnv(), dir.path(), "a", 4).FindRestorable(nullptr, &version).code() ==
        Code::kFailedPrecondition);

  // The directory of job 'a' copied under the name of job 'b'.
  REQUIRE(rename((dir.path() + "/a").c_str(), (dir.path() + "/b").c_str()) == 0);
  st = PersistReader(PosixEnv(), dir.path(), "b", 2).LoadVersion(2, nullptr, &ms);
  CHECK(st.message() == "persist dir '" + dir.path() +
                            "': version 2 was written by job 'a' with world size 2; this job is 'b' with world size 2");

  // A job with nothing there is told which jobs are.
  st = PersistReader(PosixEnv(), dir.path(), "c", 2).FindRestorable(nullptr, &version);
  CHECK(st.code() == Code::kNotFound);
  CHECK(st.message() ==
        "persist dir '" + dir.path() + "' has no complete version of job 'c' (it holds other jobs: 'b')");
}

TEST_CASE("a snapshot of another tensor layout is refused, naming the difference", "[persist][reader]") {
  ScratchDir dir;
  Written w(PosixEnv(), dir.path(), "job", 2);
  PersistReader r(PosixEnv(), dir.path(), "job", 2);
  ChunkBank other;
  std::map<int, Manifest> expected = {{0, other.Build(0, 0, {{"w", 150000, 1}, {"b", 1000, 2}})},
                                      {1, other.Build(1, 0, {{"w", 150000, 1}, {"b", 2000, 2}})}};
  std::vector<Manifest> ms;
  Status st = r.LoadVersion(2, &expected, &ms);
  CHECK(st.code() == Code::kFailedPrecondition);
  CHECK(Contains(st.message(), "persist dir '" + dir.path() + "': version 2 has another tensor layout than this job"));
  CHECK(Contains(st.message(), "tensor 'b' as uint8[2000], it was uint8[1000] at version 2"));
  uint64_t version = 0;
  CHECK(r.FindRestorable(&expected, &version).code() == Code::kFailedPrecondition);

  expected[1] = other.Build(1, 0, {{"w", 150000, 9}, {"b", 1000, 9}});  // same layout, other bytes: fine
  REQUIRE(r.LoadVersion(2, &expected, &ms).ok());
  CHECK(ms.size() == 2);
  REQUIRE(r.FindRestorable(&expected, &version).ok());
  CHECK(version == 2);
}

}  // namespace ftrun

namespace ftrun {
namespace {

RetryPolicy FastRetry() {
  RetryPolicy p;
  p.attempts = 4;
  p.first = std::chrono::milliseconds(1);
  p.max_wait = std::chrono::milliseconds(4);
  return p;
}

TEST_CASE("a transient read error (EIO) is retried; one that persists is kIoTransient, never corruption",
          "[persist][reader][security]") {
  ScratchDir dir;
  FaultEnv env(PosixEnv());
  Written w(&env, dir.path());
  PersistReader r(&env, dir.path(), "job", 1);
  r.set_retry_policy(FastRetry());
  std::string buf(1000, '\0');

  env.FailReads(EIO, 3, "/chunks/");  // three failures, the fourth try reads
  REQUIRE(r.ReadChunk(w.Bias2(), buf.data()).ok());
  CHECK(env.failed_reads() == 3);

  env.FailReads(EIO, 100, "/chunks/");
  Status st = r.ReadChunk(w.Bias2(), buf.data());
  CHECK(st.code() == Code::kIoTransient);
  CHECK(Contains(st.message(), "Input/output error"));
  CHECK(Contains(st.message(), "still failing after 4 tries"));
  CHECK(ClassifyDiskError(st) == DiskErrorClass::kTransient);

  // A manifest read that fails transiently: the version is not "incomplete".
  env.FailReads(ESTALE, 2, "/manifest");
  std::vector<Manifest> ms;
  REQUIRE(r.LoadVersion(2, nullptr, &ms).ok());
  env.FailReads(EIO, 1000, "");
  st = r.LoadVersion(2, nullptr, &ms);
  CHECK(st.code() == Code::kIoTransient);
  CHECK(ClassifyDiskError(st) == DiskErrorClass::kTransient);
  // Restore never falls back to an older version on one: it reports it.
  uint64_t version = 0;
  env.FailReads(EIO, 1000, "/chunks/");
  st = r.FindRestorable(nullptr, &version);
  CHECK(st.code() == Code::kIoTransient);
  env.FailReads(EIO, 0);

  // A hash mismatch and a missing file are the only verdicts against a version.
  CHECK(ClassifyDiskError(Status::Corruption("x")) == DiskErrorClass::kVersionBad);
  CHECK(ClassifyDiskError(Status::NotFound("x")) == DiskErrorClass::kVersionBad);
  CHECK(ClassifyDiskError(DiskErrno("cannot open 'x'", EACCES)) == DiskErrorClass::kOther);
  CHECK(ClassifyDiskError(DiskErrno("cannot open 'x'", ENOENT)) == DiskErrorClass::kVersionBad);
  for (int e : {EIO, ESTALE, EINTR, EAGAIN, ETIMEDOUT}) {
    CHECK(ClassifyDiskError(DiskErrno("cannot read 'x'", e)) == DiskErrorClass::kTransient);
  }
}

TEST_CASE("retention keeps a version it could not read for a transient error", "[persist][retention][security]") {
  ScratchDir dir;
  FaultEnv env(PosixEnv());
  Written w(&env, dir.path());
  // Version 1's manifest cannot be read now: it is not "abandoned".
  env.FailReads(EIO, 1000, "/" + VersionDirName(1) + "/");
  RetentionOptions o;
  o.env = &env;
  o.dir = dir.path();
  o.job_id = "job";
  o.keep = 1;  // version 1 would go, were it read
  RetentionResult res;
  REQUIRE(ApplyRetention(o, &res).ok());
  CHECK(res.deleted.empty());
  env.FailReads(EIO, 0);
  std::vector<uint64_t> complete;
  REQUIRE(PersistReader(&env, dir.path(), "job", 1).ListComplete(&complete).ok());
  CHECK(complete == std::vector<uint64_t>{2, 1});
}

}  // namespace
}  // namespace ftrun
