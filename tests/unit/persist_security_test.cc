// Issue 13, "Disk: one timeline, always": what gets written to the persist
// directory. A cancelled write never writes its marker; markers carry the
// version's epoch and a version whose markers disagree is refused, naming
// them; retention on one node never leaves another node's version complete
// but missing a chunk. Real files through the Env seam. (Modes and bounds:
// persist_modes_test.cc.)
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "plugin/common/bytes.h"
#include "plugin/persist/disk_format.h"
#include "plugin/persist/persist_reader.h"
#include "plugin/persist/retention.h"
#include "plugin/persist/version_scan.h"
#include "tests/catch.h"
#include "tests/unit/persist_test_util.h"

namespace ftrun {
namespace {

// Blocks a caller until Open(); says when someone is waiting.
class Gate {
 public:
  void Wait() {
    std::unique_lock<std::mutex> l(mu_);
    waiting_ = true;
    cv_.notify_all();
    cv_.wait(l, [&] { return open_; });
  }
  void AwaitWaiter() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return waiting_; });
  }
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool waiting_ = false, open_ = false;
};

// An Env that forwards to the real one and can stop one ListDir call (by
// path) at a Gate: so a test can put a retention run between its reading of
// the live set and its deletes, while another node's writer goes on.
class PausingEnv : public Env {
 public:
  explicit PausingEnv(Env* base) : base_(base) {}
  void PauseListDir(const std::string& path, Gate* gate) {
    std::lock_guard<std::mutex> l(mu_);
    pause_path_ = path;
    gate_ = gate;
  }
  Status NewWritableFile(const std::string& p, std::unique_ptr<WritableFile>* o) override {
    return base_->NewWritableFile(p, o);
  }
  Status NewRandomAccessFile(const std::string& p, std::unique_ptr<RandomAccessFile>* o) override {
    return base_->NewRandomAccessFile(p, o);
  }
  Status CreateDir(const std::string& p, bool* c) override { return base_->CreateDir(p, c); }
  Status SyncDir(const std::string& p) override { return base_->SyncDir(p); }
  Status RenameFile(const std::string& f, const std::string& t) override { return base_->RenameFile(f, t); }
  Status DeleteFile(const std::string& p) override { return base_->DeleteFile(p); }
  Status DeleteDir(const std::string& p) override { return base_->DeleteDir(p); }
  Status ListDir(const std::string& p, std::vector<std::string>* n) override {
    Gate* g = nullptr;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (gate_ != nullptr && p == pause_path_) std::swap(g, gate_);
    }
    if (g != nullptr) g->Wait();
    return base_->ListDir(p, n);
  }
  Status GetFileSize(const std::string& p, uint64_t* s) override { return base_->GetFileSize(p, s); }
  Status IsDirectory(const std::string& p, bool* d) override { return base_->IsDirectory(p, d); }

 private:
  Env* const base_;
  std::mutex mu_;
  std::string pause_path_;
  Gate* gate_ = nullptr;
};

}  // namespace

TEST_CASE("a write stuck across a go-back (Cancel, wait, ClearCancel) never writes its marker", "[persist][security]") {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> ms = {bank.Build(0, 7, {{"w", 200000, 1}})};
  PersistWriter w(WriterOptions(PosixEnv(), dir.path() + "/persist", "job", 1));
  // The write gets stuck getting its chunk bytes (a slow disk, a page fault
  // on a busy node): it is past every cancellation check before the stall.
  Gate stuck;
  std::atomic<int> calls{0};
  ChunkSource base = bank.Source();
  ChunkSource source = [&](const ChunkRef& ref, const void** data) {
    if (calls++ == 0) stuck.Wait();
    return base(ref, data);
  };
  Status st;
  std::thread t([&] { st = w.WriteVersion(7, Ptrs(ms), source); });
  stuck.AwaitWaiter();
  // The flusher's Rewind: Cancel, its bounded wait runs out, ClearCancel;
  // then the agent removes the node's files above the restored version.
  w.Cancel();
  w.ClearCancel();
  stuck.Open();
  t.join();
  INFO(st.ToString());
  CHECK(st.code() == Code::kUnavailable);
  const std::string marker = VersionDir(dir.path() + "/persist/job", 7) + "/" + NodeMarkerName(0);
  CHECK_FALSE(PosixEnv()->FileExists(marker));
  PersistReader r(nullptr, dir.path() + "/persist", "job", 1);
  std::vector<uint64_t> complete;
  REQUIRE(r.ListComplete(&complete).ok());
  CHECK(complete.empty());
  // A write decided after the go-back works (the cancel is cleared).
  REQUIRE(w.WriteVersion(7, Ptrs(ms), bank.Source()).ok());
  REQUIRE(r.ListComplete(&complete).ok());
  CHECK(complete == std::vector<uint64_t>{7});
}

TEST_CASE("a write decided before a Cancel cannot write its marker after ClearCancel", "[persist][security]") {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> ms = {bank.Build(0, 3, {{"w", 1000, 1}})};
  PersistWriter w(WriterOptions(PosixEnv(), dir.path() + "/persist", "job", 1));
  uint64_t decided = w.generation();  // the flusher hands the job over with this
  w.Cancel();
  w.ClearCancel();
  Status st = w.WriteVersion(3, 0, Ptrs(ms), bank.Source(), decided);
  CHECK(st.code() == Code::kUnavailable);
  CHECK_FALSE(PosixEnv()->FileExists(VersionDir(dir.path() + "/persist/job", 3) + "/" + NodeMarkerName(0)));
}

TEST_CASE("a version whose node markers carry different epochs is refused, naming both files", "[persist][security]") {
  ScratchDir dir;
  ChunkBank bank;
  const std::string root = dir.path() + "/persist";
  std::vector<Manifest> m0 = {bank.Build(0, 9, {{"w", 100000, 1}})};
  std::vector<Manifest> m1 = {bank.Build(1, 9, {{"w", 100000, 2}})};
  PersistWriter n0(WriterOptions(PosixEnv(), root, "job", 2, 0));
  PersistWriter n1(WriterOptions(PosixEnv(), root, "job", 2, 1));
  // Node 0 wrote version 9 in epoch 4; the job went back below it, and node
  // 1 wrote the new timeline's version 9 in epoch 6.
  REQUIRE(n0.WriteVersion(9, 4, Ptrs(m0), bank.Source()).ok());
  REQUIRE(n1.WriteVersion(9, 6, Ptrs(m1), bank.Source()).ok());
  PersistReader r(nullptr, root, "job", 2);
  std::vector<uint64_t> complete;
  std::vector<std::string> skipped;
  REQUIRE(r.ListComplete(&complete, &skipped).ok());
  CHECK(complete.empty());
  std::vector<Manifest> out;
  Status st = r.LoadVersion(9, nullptr, &out);
  INFO(st.ToString());
  CHECK_FALSE(st.ok());
  const std::string vdir = VersionDir(root + "/job", 9);
  CHECK(Contains(st.message(), vdir + "/node0.COMPLETE' has epoch 4"));
  CHECK(Contains(st.message(), vdir + "/node1.COMPLETE' has epoch 6"));
  CHECK(Contains(st.message(), "two timelines"));
  uint64_t v = 0;
  CHECK(r.FindRestorable(nullptr, &v).code() == Code::kNotFound);
  // The same epoch on both: complete, and the scan says which.
  REQUIRE(PosixEnv()->DeleteFile(vdir + "/node1.COMPLETE").ok());
  REQUIRE(n1.WriteVersion(9, 4, Ptrs(m1), bank.Source()).ok());
  VersionScan s = ScanVersion(PosixEnv(), root + "/job", 9);
  INFO(s.reason);
  CHECK(s.complete);
  CHECK(s.epoch == 4);
}

TEST_CASE("a node's own marker of another epoch is not taken as already written", "[persist][security]") {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> ms = {bank.Build(0, 2, {{"w", 1000, 1}})};
  PersistWriter w(WriterOptions(PosixEnv(), dir.path() + "/persist", "job", 1));
  REQUIRE(w.WriteVersion(2, 1, Ptrs(ms), bank.Source()).ok());
  // A deterministic trainer saves the same bytes as version 2 again after a
  // go-back: another timeline, so the old marker must go first.
  Status st = w.WriteVersion(2, 3, Ptrs(ms), bank.Source());
  CHECK(st.code() == Code::kFailedPrecondition);
  CHECK(Contains(st.message(), "epoch 1, this write's epoch 3"));
}

TEST_CASE("format 1 markers read as epoch-less, and never complete a version with a format 2 one",
          "[persist][security]") {
  ScratchDir dir;
  ChunkBank bank;
  const std::string root = dir.path() + "/persist";
  std::vector<Manifest> m0 = {bank.Build(0, 4, {{"w", 1000, 1}})};
  std::vector<Manifest> m1 = {bank.Build(1, 4, {{"w", 1000, 2}})};
  PersistWriter n0(WriterOptions(PosixEnv(), root, "job", 2, 0));
  PersistWriter n1(WriterOptions(PosixEnv(), root, "job", 2, 1));
  REQUIRE(n0.WriteVersion(4, 0, Ptrs(m0), bank.Source()).ok());
  REQUIRE(n1.WriteVersion(4, 0, Ptrs(m1), bank.Source()).ok());
  const std::string vdir = VersionDir(root + "/job", 4);
  auto downgrade = [&](int node) {  // rewrite the marker as an older build did
    std::string bytes;
    NodeMarker m;
    REQUIRE(PosixEnv()->ReadFile(vdir + "/" + NodeMarkerName(node), &bytes).ok());
    REQUIRE(DecodeNodeMarker(bytes, "x", &m).ok());
    REQUIRE(m.has_epoch);
    m.has_epoch = false;
    std::string old = EncodeNodeMarker(m);
    CHECK(old[8] == 1);  // format version 1
    REQUIRE(PosixEnv()->DeleteFile(vdir + "/" + NodeMarkerName(node)).ok());
    std::unique_ptr<WritableFile> f;
    REQUIRE(PosixEnv()->NewWritableFile(vdir + "/" + NodeMarkerName(node), &f).ok());
    REQUIRE(f->Append(old.data(), old.size()).ok());
    REQUIRE(f->Close().ok());
  };
  downgrade(0);
  VersionScan mixed = ScanVersion(PosixEnv(), root + "/job", 4);
  CHECK_FALSE(mixed.complete);
  CHECK(mixed.mixed_epochs);
  CHECK(Contains(mixed.reason, "node0.COMPLETE' has no epoch (format 1"));
  CHECK(Contains(mixed.reason, "node1.COMPLETE' has epoch 0"));
  downgrade(1);
  VersionScan old = ScanVersion(PosixEnv(), root + "/job", 4);
  INFO(old.reason);
  CHECK(old.complete);
  CHECK_FALSE(old.has_epoch);
}

TEST_CASE("retention on one node never leaves another node's version complete but missing a chunk",
          "[persist][security]") {
  ScratchDir dir;
  ChunkBank bank;
  PausingEnv env(PosixEnv());
  const std::string root = dir.path() + "/persist";
  const std::string job_dir = root + "/job";
  // Rank 1 (node 1) has bytes A in version 1, B in version 2, and A again
  // in version 3 (a parameter that went back to earlier values).
  auto v = [&](int rank, uint64_t version, uint64_t seed) {
    return std::vector<Manifest>{bank.Build(rank, version, {{"w", 70000, seed}})};
  };
  PersistWriterOptions o0 = WriterOptions(&env, root, "job", 2, 0);
  PersistWriterOptions o1 = WriterOptions(&env, root, "job", 2, 1);
  PersistWriter n0(o0), n1(o1);
  auto m01 = v(0, 1, 10), m11 = v(1, 1, 100), m02 = v(0, 2, 20), m12 = v(1, 2, 200), m03 = v(0, 3, 30),
       m13 = v(1, 3, 100);
  REQUIRE(n0.WriteVersion(1, 5, Ptrs(m01), bank.Source()).ok());
  REQUIRE(n1.WriteVersion(1, 5, Ptrs(m11), bank.Source()).ok());
  REQUIRE(n0.WriteVersion(2, 5, Ptrs(m02), bank.Source()).ok());
  REQUIRE(n1.WriteVersion(2, 5, Ptrs(m12), bank.Source()).ok());
  REQUIRE(n0.WriteVersion(3, 5, Ptrs(m03), bank.Source()).ok());
  // Node 0's retention (keep 1) deletes version 1: its chunks of bytes A are
  // dead in the live set it reads (version 3 has no manifest of rank 1
  // yet). It stops before listing the chunk directory of A's first chunk.
  const ChunkHash a0 = m11[0].tensors[0].chunks[0].hash;
  Gate paused;
  env.PauseListDir(ChunkSubdir(job_dir, a0), &paused);
  RetentionOptions ro;
  ro.dir = root;
  ro.job_id = "job";
  ro.keep = 1;
  ro.node = 0;
  ro.env = &env;
  RetentionResult rr;
  Status rst;
  std::thread retention([&] { rst = ApplyRetention(ro, &rr); });
  paused.AwaitWaiter();
  // Node 1 writes version 3: its manifest, then A's chunk files, which are
  // still there, so it skips them.
  Status wst;
  const uint64_t skipped_before = n1.Progress().chunks_skipped;
  std::thread writer([&] { wst = n1.WriteVersion(3, 5, Ptrs(m13), bank.Source()); });
  while (n1.Progress().chunks_skipped < skipped_before + 1) {  // A's first chunk (its directory is paused)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  paused.Open();  // retention goes on with its old live set
  retention.join();
  writer.join();
  INFO(rst.ToString() << " / " << wst.ToString());
  INFO("retention deleted " << rr.deleted.size() << " versions, " << rr.chunks_deleted << " chunks, kept "
                            << rr.chunks_kept << " " << rr.gc_skipped << "; writer skipped "
                            << n1.Progress().chunks_skipped);
  CHECK(rr.chunks_kept >= 1);  // set aside, then found live again
  REQUIRE(rst.ok());
  REQUIRE(wst.ok());
  // Whatever the interleaving, version 3 is complete only with every chunk.
  PersistReader r(nullptr, root, "job", 2);
  std::vector<uint64_t> complete;
  REQUIRE(r.ListComplete(&complete).ok());
  REQUIRE(std::find(complete.begin(), complete.end(), 3) != complete.end());
  Status verify = r.Verify(3);
  INFO(verify.ToString());
  CHECK(verify.ok());
}

}  // namespace ftrun
