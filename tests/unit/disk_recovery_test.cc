// DiskRecovery in a one-node job that starts again over its persist
// directory: real files, a real disk worker thread, a real store, the
// hosted coordinator and Generations with real /bin/sh ranks. The
// coordinator has the directory scanned, plans the newest complete version,
// this node reads it (byte for byte), and the ranks start from it; a version
// with a chunk corrupted on disk is reported bad and the job goes back to the
// older one.
#include "launcher/agent/disk_recovery.h"

#include <cstring>

#include "plugin/persist/disk_format.h"
#include "plugin/persist/fault_env.h"
#include "tests/unit/agent_parts_fixture.h"
#include "tests/unit/persist_test_util.h"

namespace ftrun {
namespace {

using agent_parts::Node;

// Versions 1 and 2 of ranks 0 and 1 of job "job" on disk; version 2 changes
// the bias.
struct Disk {
  ScratchDir dir;
  ChunkBank bank;
  std::vector<Manifest> v1, v2;
  Disk() {
    for (int r = 0; r < 2; ++r) {
      v1.push_back(bank.Build(r, 1, {{"w", 20000, 10 + static_cast<uint64_t>(r)}, {"b", 1000, 1}}));
      v2.push_back(bank.Build(r, 2, {{"w", 20000, 10 + static_cast<uint64_t>(r)}, {"b", 1000, 2}}));
    }
    PersistWriter w(WriterOptions(PosixEnv(), dir.path(), "job", 2));
    REQUIRE(w.WriteVersion(1, Ptrs(v1), bank.Source()).ok());
    REQUIRE(w.WriteVersion(2, Ptrs(v2), bank.Source()).ok());
  }
};

bool SameBytes(const Node& n, const ChunkBank& bank, int rank, uint64_t version) {
  const Manifest* m = n.store.Find(rank, version);
  if (m == nullptr) return false;
  for (const auto& t : m->tensors) {
    for (const auto& c : t.chunks) {
      const std::string& want = bank.Bytes(c.hash);
      if (want.size() != c.length || std::memcmp(n.arena.data() + c.offset, want.data(), c.length) != 0) return false;
    }
  }
  return true;
}

TEST_CASE("disk recovery: a job started again restores its newest version from disk and starts from it",
          "[disk_recovery]") {
  Disk disk;
  Node n("sleep 300", 2, disk.dir.path());
  REQUIRE(n.PassUntil([&] { return n.gens->running(); }));
  CHECK(n.gens->restore_version() == std::optional<uint64_t>(2));
  CHECK(n.tracker.last_committed() == std::optional<uint64_t>(2));
  CHECK(SameBytes(n, disk.bank, 0, 2));
  CHECK(SameBytes(n, disk.bank, 1, 2));
}

TEST_CASE("disk recovery: a chunk corrupted on disk makes the job go back to the older version", "[disk_recovery]") {
  Disk disk;
  FaultEnv env(PosixEnv());
  const ChunkRef& bias = disk.v2[1].tensors[1].chunks[0];
  REQUIRE(env.FlipBitOnDisk(ChunkPath(disk.dir.path() + "/job", bias.hash), kChunkHeaderSize + 10, 2).ok());
  Node n("sleep 300", 2, disk.dir.path());
  REQUIRE(n.PassUntil([&] { return n.gens->running(); }));
  CHECK(n.gens->restore_version() == std::optional<uint64_t>(1));
  CHECK(n.store.Find(1, 2) == nullptr);
  CHECK(SameBytes(n, disk.bank, 0, 1));
  CHECK(SameBytes(n, disk.bank, 1, 1));
}

}  // namespace
}  // namespace ftrun
