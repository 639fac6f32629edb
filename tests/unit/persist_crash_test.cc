// Crash consistency of the writer and of retention under FaultEnv: a crash
// at every point, full disks, I/O errors. Whatever happens, a reader sees
// only complete versions that verify, and what was complete stays complete.
// The scratch directories are on tmpfs: FaultEnv models durability, so real
// fsyncs would only make the loops slow.
#include <cerrno>

#include "plugin/persist/disk_format.h"
#include "plugin/persist/fault_env.h"
#include "plugin/persist/persist_reader.h"
#include "plugin/persist/retention.h"
#include "tests/catch.h"
#include "tests/unit/persist_test_util.h"

namespace ftrun {
namespace {

struct Job {
  ChunkBank bank;
  std::vector<Manifest> v1, v2;
  Job() {
    v1 = {bank.Build(0, 1, {{"w", 200000, 1}, {"b", 1000, 2}}), bank.Build(1, 1, {{"w", 200000, 3}, {"b", 1000, 4}})};
    // Version 2 shares rank 0's weight with version 1 and changes the rest.
    v2 = {bank.Build(0, 2, {{"w", 200000, 1}, {"b", 1000, 5}}), bank.Build(1, 2, {{"w", 200000, 6}, {"b", 1000, 7}})};
  }
};

std::vector<uint64_t> Complete(Env* env, const std::string& root) {
  std::vector<uint64_t> versions;
  REQUIRE(PersistReader(env, root, "job", 2).ListComplete(&versions).ok());
  return versions;
}

bool Has(const std::vector<uint64_t>& v, uint64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Every complete version verifies: its manifests match the markers and every
// chunk its hash.
void CheckAllCompleteVerify(Env* env, const std::string& root) {
  PersistReader r(env, root, "job", 2);
  for (uint64_t v : Complete(env, root)) {
    Status st = r.Verify(v);
    INFO("version " << v << ": " << st.ToString());
    CHECK(st.ok());
  }
}

// Every chunk file under its final name is whole: its header decodes, its
// size is the header's length, its bytes hash to its name. A name that looks
// final is never torn, whatever version it belongs to (complete or not).
// Returns how many there are.
int CheckChunkFilesWhole(Env* env, const std::string& job_dir) {
  std::vector<std::string> subs, names;
  if (!env->ListDir(job_dir + "/chunks", &subs).ok()) return 0;
  int n = 0;
  for (const auto& sub : subs) {
    REQUIRE(env->ListDir(job_dir + "/chunks/" + sub, &names).ok());
    for (const auto& name : names) {
      ChunkHash want;
      if (!ParseChunkFileName(name, &want)) continue;  // a tmp file
      const std::string path = job_dir + "/chunks/" + sub + "/" + name;
      std::string bytes;
      REQUIRE(env->ReadFile(path, &bytes).ok());
      ChunkHash hash;
      uint64_t length = 0;
      Status st = DecodeChunkHeader(bytes.data(), bytes.size(), path, &hash, &length);
      INFO(path << ": " << st.ToString());
      CHECK(st.ok());
      CHECK(hash == want);
      CHECK(bytes.size() == kChunkHeaderSize + length);
      if (st.ok() && bytes.size() == kChunkHeaderSize + length) {
        CHECK(HashBytes(bytes.data() + kChunkHeaderSize, length) == want);
      }
      ++n;
    }
  }
  return n;
}

// Files left under tmp names anywhere below `dir`.
int TmpFiles(const std::string& dir) {
  std::vector<std::string> names;
  if (!PosixEnv()->ListDir(dir, &names).ok()) return 0;
  int n = 0;
  for (const auto& name : names) {
    bool is_dir = false;
    REQUIRE(PosixEnv()->IsDirectory(dir + "/" + name, &is_dir).ok());
    int node = 0;
    n += is_dir ? TmpFiles(dir + "/" + name) : IsTmpName(name, &node) ? 1 : 0;
  }
  return n;
}

}  // namespace

TEST_CASE("a crash at any point of the first write leaves nothing or a complete version", "[persist][crash]") {
  Job job;
  uint64_t total = 0;
  {
    ScratchDir dir("/dev/shm");
    FaultEnv env(PosixEnv());
    PersistWriter w(WriterOptions(&env, dir.path() + "/persist", "job", 2));
    REQUIRE(w.WriteVersion(1, Ptrs(job.v1), job.bank.Source()).ok());
    total = env.ops();
  }
  int complete_after_crash = 0, chunk_files_seen = 0;
  for (uint64_t k = 0; k <= total; ++k) {
    ScratchDir dir("/dev/shm");
    const std::string root = dir.path() + "/persist";
    FaultEnv env(PosixEnv());
    env.CrashAfter(k);
    Status st = PersistWriter(WriterOptions(&env, root, "job", 2)).WriteVersion(1, Ptrs(job.v1), job.bank.Source());
    INFO("crash after " << k << " of " << total << " calls: " << st.ToString());
    CHECK(st.ok() == (k == total));
    REQUIRE(env.Crash().ok());
    std::vector<uint64_t> versions = Complete(&env, root);
    complete_after_crash += Has(versions, 1);
    CheckAllCompleteVerify(&env, root);
    chunk_files_seen += CheckChunkFilesWhole(&env, root + "/job");
    // The restarted agent writes it again and it is complete.
    REQUIRE(PersistWriter(WriterOptions(&env, root, "job", 2)).WriteVersion(1, Ptrs(job.v1), job.bank.Source()).ok());
    CHECK(Complete(&env, root) == std::vector<uint64_t>{1});
    CheckAllCompleteVerify(&env, root);
  }
  CHECK(complete_after_crash == 1);  // only when the last call (the marker's dir sync) went through
  CHECK(chunk_files_seen > 0);       // crashes after some chunks were durable, before the marker
}

TEST_CASE("a crash at any point of a later write never damages the complete version", "[persist][crash]") {
  Job job;
  uint64_t total = 0;
  {
    ScratchDir dir("/dev/shm");
    FaultEnv env(PosixEnv());
    PersistWriter w(WriterOptions(&env, dir.path(), "job", 2));
    REQUIRE(w.WriteVersion(1, Ptrs(job.v1), job.bank.Source()).ok());
    uint64_t before = env.ops();
    REQUIRE(w.WriteVersion(2, Ptrs(job.v2), job.bank.Source()).ok());
    total = env.ops() - before;
    CHECK(w.Progress().chunks_skipped == 4);  // rank 0's weight
  }
  for (uint64_t k = 0; k <= total; ++k) {
    ScratchDir dir("/dev/shm");
    FaultEnv env(PosixEnv());
    PersistWriter w(WriterOptions(&env, dir.path(), "job", 2));
    REQUIRE(w.WriteVersion(1, Ptrs(job.v1), job.bank.Source()).ok());
    env.CrashAfter(k);
    Status st = w.WriteVersion(2, Ptrs(job.v2), job.bank.Source());
    INFO("crash after " << k << " of " << total << " calls: " << st.ToString());
    CHECK(st.ok() == (k == total));
    REQUIRE(env.Crash().ok());
    std::vector<uint64_t> versions = Complete(&env, dir.path());
    CHECK(Has(versions, 1));
    CHECK(Has(versions, 2) == (k == total));
    CheckAllCompleteVerify(&env, dir.path());
    CheckChunkFilesWhole(&env, dir.path() + "/job");
    uint64_t restorable = 0;
    REQUIRE(PersistReader(&env, dir.path(), "job", 2).FindRestorable(nullptr, &restorable).ok());
    CHECK(restorable == (k == total ? 2 : 1));

    PersistWriter again(WriterOptions(&env, dir.path(), "job", 2));
    REQUIRE(again.WriteVersion(2, Ptrs(job.v2), job.bank.Source()).ok());
    CHECK(Complete(&env, dir.path()) == std::vector<uint64_t>({2, 1}));
    CheckAllCompleteVerify(&env, dir.path());
  }
}

TEST_CASE("a full disk fails the write clearly, damages nothing, and a retry succeeds", "[persist][crash]") {
  Job job;
  for (uint64_t budget : {0, 100, 4096, 5000, 70000, 150000, 220000}) {
    ScratchDir dir("/dev/shm");
    FaultEnv env(PosixEnv());
    PersistWriter w(WriterOptions(&env, dir.path(), "job", 2));
    REQUIRE(w.WriteVersion(1, Ptrs(job.v1), job.bank.Source()).ok());
    env.FailWrites(WriteFault{ENOSPC, budget, 1.0, 1});
    Status st = w.WriteVersion(2, Ptrs(job.v2), job.bank.Source());
    INFO("disk full after " << budget << " bytes: " << st.ToString());
    CHECK(st.code() == Code::kIoError);
    CHECK(Contains(st.message(), "persist: writing version 2 to '" + dir.path() + "/job'"));
    CHECK(Contains(st.message(), "No space left on device"));
    CHECK(Contains(st.message(), dir.path() + "/job/"));  // names the file
    CHECK(TmpFiles(dir.path()) == 0);                     // space given back
    CHECK(Complete(&env, dir.path()) == std::vector<uint64_t>{1});
    CheckAllCompleteVerify(&env, dir.path());
    // Space returns: the same writer retries, and the power may fail after.
    env.ClearWriteFaults();
    REQUIRE(w.WriteVersion(2, Ptrs(job.v2), job.bank.Source()).ok());
    REQUIRE(env.Crash().ok());
    CHECK(Complete(&env, dir.path()) == std::vector<uint64_t>({2, 1}));
    CheckAllCompleteVerify(&env, dir.path());
  }
}

TEST_CASE("random I/O errors fail writes cleanly; complete versions stay complete", "[persist][crash]") {
  Job job;
  int failed = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    ScratchDir dir("/dev/shm");
    FaultEnv env(PosixEnv());
    PersistWriter w(WriterOptions(&env, dir.path(), "job", 2));
    REQUIRE(w.WriteVersion(1, Ptrs(job.v1), job.bank.Source()).ok());
    env.FailWrites(WriteFault{EIO, 0, 0.05, seed});
    Status st = w.WriteVersion(2, Ptrs(job.v2), job.bank.Source());
    INFO("seed " << seed << ": " << st.ToString());
    if (!st.ok()) {
      ++failed;
      CHECK(Contains(st.message(), "Input/output error"));
    }
    env.ClearWriteFaults();
    REQUIRE(env.Crash().ok());
    CHECK(Has(Complete(&env, dir.path()), 1));
    CheckAllCompleteVerify(&env, dir.path());
    REQUIRE(
        PersistWriter(WriterOptions(&env, dir.path(), "job", 2)).WriteVersion(2, Ptrs(job.v2), job.bank.Source()).ok());
    CheckAllCompleteVerify(&env, dir.path());
  }
  CHECK(failed > 5);
}

TEST_CASE("a crash at any point of retention never leaves a complete version with files missing", "[persist][crash]") {
  Job job;
  auto setup = [&](FaultEnv* env, const std::string& root) {
    PersistWriter w(WriterOptions(env, root, "job", 2));
    REQUIRE(w.WriteVersion(1, Ptrs(job.v1), job.bank.Source()).ok());
    REQUIRE(w.WriteVersion(2, Ptrs(job.v2), job.bank.Source()).ok());
  };
  RetentionOptions o;
  o.job_id = "job";
  o.keep = 1;
  uint64_t total = 0;
  {
    ScratchDir dir("/dev/shm");
    FaultEnv env(PosixEnv());
    setup(&env, dir.path());
    uint64_t before = env.ops();
    o.dir = dir.path();
    o.env = &env;
    RetentionResult result;
    REQUIRE(ApplyRetention(o, &result).ok());
    CHECK(result.deleted == std::vector<uint64_t>{1});
    CHECK(result.chunks_deleted == 6);  // all of version 1 but rank 0's weight
    total = env.ops() - before;
  }
  for (uint64_t k = 0; k <= total; ++k) {
    ScratchDir dir("/dev/shm");
    FaultEnv env(PosixEnv());
    setup(&env, dir.path());
    o.dir = dir.path();
    o.env = &env;
    env.CrashAfter(k);
    RetentionResult result;
    Status st = ApplyRetention(o, &result);
    INFO("crash after " << k << " of " << total << " calls: " << st.ToString());
    REQUIRE(env.Crash().ok());
    std::vector<uint64_t> versions = Complete(&env, dir.path());
    CHECK(Has(versions, 2));
    CheckAllCompleteVerify(&env, dir.path());
    REQUIRE(ApplyRetention(o, &result).ok());
    CHECK(Complete(&env, dir.path()) == std::vector<uint64_t>{2});
    CheckAllCompleteVerify(&env, dir.path());
  }
}

}  // namespace ftrun
