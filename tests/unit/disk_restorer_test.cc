// DiskRestorer against real files, a real disk worker thread and a real
// store over real memory: a node's ranks of a version come back from disk
// byte for byte (only the chunks the store lacks are read); a bad version,
// another world's files and a missing persist.dir end as the coordinator
// must hear them; a newer plan or a halt drops the restore in flight.
#include "launcher/agent/disk_restorer.h"

#include <poll.h>

#include <cstring>

#include "plugin/persist/disk_format.h"
#include "plugin/persist/fault_env.h"
#include "tests/catch.h"
#include "tests/unit/persist_test_util.h"

namespace ftrun {
namespace {

constexpr uint64_t kBase = 4096;
constexpr uint64_t kData = 8 << 20;

// Versions 1 and 2 of a 3-rank job "job" on disk; version 2 changes the bias.
struct Disk {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> v1, v2;
  explicit Disk(int world = 3) {
    for (int r = 0; r < world; ++r) {
      v1.push_back(bank.Build(r, 1, {{"w", 300000, 10 + static_cast<uint64_t>(r)}, {"b", 1000, 1}}));
      v2.push_back(bank.Build(r, 2, {{"w", 300000, 10 + static_cast<uint64_t>(r)}, {"b", 1000, 2}}));
    }
    PersistWriter w(WriterOptions(PosixEnv(), dir.path(), "job", world));
    REQUIRE(w.WriteVersion(1, Ptrs(v1), bank.Source()).ok());
    REQUIRE(w.WriteVersion(2, Ptrs(v2), bank.Source()).ok());
  }
};

struct Node {
  std::vector<char> arena = std::vector<char>(kBase + kData);
  SnapshotStore store{kBase, kData, "budget"};
  ManualClock clock;
  DiskWorker worker;
  DiskRestorer restorer{&store, arena.data(), clock};
  std::vector<DiskRestorer::Result> results;
  Node() {
    REQUIRE(worker.Start().ok());
    restorer.on_done = [this](DiskRestorer::Result r) { results.push_back(std::move(r)); };
  }
  DiskRestorer::Where Where(const std::string& dir, int world = 3) { return {dir, "job", world, /*node=*/1, nullptr}; }
  // Runs the worker's completions until nothing is in flight.
  void Settle() {
    for (int i = 0; i < 1000 && restorer.busy(); ++i) {
      pollfd p{worker.event_fd(), POLLIN, 0};
      REQUIRE(::poll(&p, 1, 10000) == 1);
      worker.RunCompleted();
    }
    REQUIRE_FALSE(restorer.busy());
  }
  // Every chunk of (rank, version) in the store holds the bytes written.
  bool SameBytes(const ChunkBank& bank, int rank, uint64_t version) const {
    const Manifest* m = store.Find(rank, version);
    if (m == nullptr) return false;
    for (const auto& t : m->tensors) {
      for (const auto& c : t.chunks) {
        const std::string& want = bank.Bytes(c.hash);
        if (want.size() != c.length || std::memcmp(arena.data() + c.offset, want.data(), c.length) != 0) return false;
      }
    }
    return true;
  }
};

PullMsg Plan(uint64_t epoch, uint64_t version, std::vector<int> ranks) {
  PullMsg m;
  m.epoch = epoch;
  m.version = version;
  m.from_disk = true;
  for (int r : ranks) m.ranks.push_back({r, {}});
  return m;
}

TEST_CASE("disk restorer: this node's ranks come back byte for byte; chunks the store holds are not read",
          "[restore]") {
  Disk disk;
  Node n;
  n.restorer.Begin(Plan(4, 1, {1, 2}), n.Where(disk.dir.path()), &n.worker);
  n.Settle();
  REQUIRE(n.results.size() == 1);
  const DiskRestorer::Result& r = n.results[0];
  INFO(r.message);
  CHECK(r.outcome == DiskRestorer::Outcome::kRestored);
  CHECK(r.epoch == 4);
  CHECK(r.version == 1);
  CHECK(r.ranks == std::vector<int>{1, 2});
  CHECK(n.SameBytes(disk.bank, 1, 1));
  CHECK(n.SameBytes(disk.bank, 2, 1));
  CHECK(n.store.Find(0, 1) == nullptr);               // another node's rank
  CHECK(r.bytes_read == 2 * (300000 + 1000) - 1000);  // the bias is the same bytes in both ranks
  CHECK(n.store.Stats().reserved_bytes == 0);

  // Version 2 shares the weights: only its bias is read.
  n.restorer.Begin(Plan(5, 2, {1, 2}), n.Where(disk.dir.path()), &n.worker);
  n.Settle();
  REQUIRE(n.results.size() == 2);
  CHECK(n.results[1].outcome == DiskRestorer::Outcome::kRestored);
  CHECK(n.results[1].bytes_read == 1000);
  CHECK(n.SameBytes(disk.bank, 2, 2));
}

TEST_CASE("disk restorer: a chunk corrupted on disk makes the version bad; the reservations go", "[restore]") {
  Disk disk;
  FaultEnv env(PosixEnv());
  const ChunkRef& bias = disk.v2[1].tensors[1].chunks[0];
  REQUIRE(env.FlipBitOnDisk(ChunkPath(disk.dir.path() + "/job", bias.hash), kChunkHeaderSize + 10, 2).ok());
  Node n;
  n.restorer.Begin(Plan(3, 2, {1}), n.Where(disk.dir.path()), &n.worker);
  n.Settle();
  REQUIRE(n.results.size() == 1);
  CHECK(n.results[0].outcome == DiskRestorer::Outcome::kVersionBad);
  CHECK(Contains(n.results[0].message, "node 1: version 2 on disk cannot be restored: "));
  CHECK(Contains(n.results[0].message, bias.hash.ToHex()));
  CHECK(n.store.Find(1, 2) == nullptr);
  CHECK(n.store.Stats().reserved_bytes == 0);
}

TEST_CASE("disk restorer: another world's files or no persist.dir stop the job, naming why", "[restore]") {
  Disk disk;
  Node n;
  n.restorer.Begin(Plan(3, 1, {1}), n.Where(disk.dir.path(), /*world=*/4), &n.worker);
  n.Settle();
  REQUIRE(n.results.size() == 1);
  CHECK(n.results[0].outcome == DiskRestorer::Outcome::kFatal);
  CHECK(Contains(n.results[0].message, "node 1: "));
  CHECK(Contains(n.results[0].message, "world size"));

  n.restorer.Begin(Plan(3, 1, {1}), n.Where(""), &n.worker);  // ends at once
  REQUIRE(n.results.size() == 2);
  CHECK(n.results[1].outcome == DiskRestorer::Outcome::kFatal);
  CHECK(n.results[1].message == "node 1: this agent has no persist.dir");

  n.restorer.Begin(Plan(3, 7, {1}), n.Where(disk.dir.path()), &n.worker);  // no such version
  n.Settle();
  REQUIRE(n.results.size() == 3);
  CHECK(n.results[2].outcome == DiskRestorer::Outcome::kVersionBad);
}

TEST_CASE("disk restorer: a newer plan drops the restore in flight; a halt drops it with nothing after", "[restore]") {
  Disk disk;
  Node n;
  n.restorer.Begin(Plan(3, 2, {0, 1, 2}), n.Where(disk.dir.path()), &n.worker);
  n.restorer.Begin(Plan(4, 1, {0}), n.Where(disk.dir.path()), &n.worker);
  n.Settle();
  REQUIRE(n.results.size() == 1);  // the first one said nothing
  CHECK(n.results[0].epoch == 4);
  CHECK(n.results[0].outcome == DiskRestorer::Outcome::kRestored);
  CHECK(n.SameBytes(disk.bank, 0, 1));
  CHECK(n.store.Find(1, 2) == nullptr);
  CHECK(n.store.Find(2, 2) == nullptr);
  CHECK(n.store.Stats().reserved_bytes == 0);

  n.restorer.Begin(Plan(5, 2, {1, 2}), n.Where(disk.dir.path()), &n.worker);
  n.restorer.Cancel();
  n.Settle();
  CHECK(n.results.size() == 1);
  CHECK(n.store.Find(1, 2) == nullptr);
  CHECK(n.store.Stats().reserved_bytes == 0);
}

}  // namespace
}  // namespace ftrun
