// NodeDisk against a real flusher writing real files: commits reach disk
// (the drain on exit included), a fenced agent drains nothing, markers wait
// for the coordinator's lease in a multi-node job, a go-back removes only
// this node's files above the version, and a flusher that cannot start
// leaves the job in RAM only.
#include "launcher/agent/node_disk.h"

#include <sys/stat.h>

#include <cstring>

#include "plugin/common/safe_dir.h"
#include "plugin/persist/disk_format.h"
#include "tests/catch.h"
#include "tests/unit/persist_test_util.h"
#include "tests/unit/store_test_util.h"

namespace ftrun {
namespace {

constexpr uint64_t kBase = 4096;

struct Node {
  ScratchDir dir;
  std::vector<char> arena = std::vector<char>(kBase + 64 * 4096);
  SnapshotStore store{kBase, 64 * 4096, "budget"};
  ManualClock clock;
  std::unique_ptr<NodeDisk> disk;

  // `every`: a write at every commit (else only the drain writes).
  explicit Node(bool leased = false, std::string root = "", bool every = true) {
    NodeDisk::Options o;
    o.config.dir = root.empty() ? dir.path() : root;
    o.config.every_versions = every ? 1 : 0;
    o.config.every_seconds = std::chrono::milliseconds(every ? 0 : 3600000);
    o.config.direct_io = false;
    o.config.drain_timeout = std::chrono::milliseconds(20000);
    o.job_id = "job";
    o.arena_base = arena.data();
    o.leased = leased;
    o.ranks = [] { return std::vector<int>{2}; };
    disk = std::make_unique<NodeDisk>(std::move(o), &store, clock);
    disk->Assign(1, 4);  // node 1 of a 4-rank job: rank 2 is this node's
  }
  // Rank 2 saves `version`: one chunk of its own bytes.
  void Save(uint64_t version) { SaveOneChunk(&store, 2, version, Pattern(version, 4096), arena.data()); }
  std::string VersionFile(uint64_t v, const std::string& name) const {
    return VersionDir(PersistJobDir(dir.path(), "job"), v) + "/" + name;
  }
  bool Exists(const std::string& path) const {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
  }
  bool Marked(uint64_t v) const { return Exists(VersionFile(v, NodeMarkerName(1))); }
};

TEST_CASE("node disk: a commit reaches disk, with this node's marker and its ranks' manifests", "[node_disk]") {
  Node n;
  CHECK(n.disk->enabled());
  CHECK_FALSE(n.disk->StatusJson().has_value());  // no flusher before the first commit
  n.Save(1);
  n.disk->Committed(1, 1);
  n.disk->Drain(1, /*fenced=*/false);
  CHECK(n.Marked(1));
  CHECK(n.Exists(n.VersionFile(1, ManifestFileName(2))));
  CHECK(n.disk->StatusJson().has_value());
}

TEST_CASE("node disk: a fenced agent drains nothing; an agent still in the job drains its last commit", "[node_disk]") {
  Node n(false, "", /*every=*/false);
  n.Save(1);
  n.disk->Committed(1, 1);
  CHECK_FALSE(n.Marked(1));  // not time to write yet
  n.disk->Drain(1, /*fenced=*/true);
  CHECK_FALSE(n.Marked(1));
  n.disk->Drain(1, /*fenced=*/false);
  CHECK(n.Marked(1));
}

TEST_CASE("node disk: in a multi-node job a marker waits for the coordinator's lease", "[node_disk]") {
  Node n(/*leased=*/true);
  n.Save(1);
  n.disk->Committed(1, 1);
  n.disk->Drain(1, false);  // no lease: the write cannot complete
  CHECK_FALSE(n.Marked(1));
  n.disk->LeaseUntil(n.clock.Now() + std::chrono::seconds(5));
  n.Save(2);
  n.disk->Committed(2, 1);
  n.disk->Drain(2, false);
  CHECK(n.Marked(2));
  n.disk->EndLease();  // lost the coordinator, or fenced
  n.Save(3);
  n.disk->Committed(3, 1);
  n.disk->Drain(3, false);
  CHECK_FALSE(n.Marked(3));
  n.disk->LeaseForever();  // the coordinator ended the job
  n.disk->Drain(3, false);
  CHECK(n.Marked(3));
}

TEST_CASE("node disk: a go-back removes this node's files above the version, and nobody else's", "[node_disk]") {
  Node n;
  for (uint64_t v = 1; v <= 2; ++v) {
    n.Save(v);
    n.disk->Committed(v, 1);
    n.disk->Drain(v, false);
    REQUIRE(n.Marked(v));
  }
  const std::string other = n.VersionFile(2, NodeMarkerName(0));  // another node's marker
  REQUIRE(CreateNewFile(other, "").ok());
  n.disk->DropFilesAbove(1, {2});
  CHECK(n.Marked(1));
  CHECK(n.Exists(n.VersionFile(1, ManifestFileName(2))));
  CHECK_FALSE(n.Marked(2));
  CHECK_FALSE(n.Exists(n.VersionFile(2, ManifestFileName(2))));
  CHECK(n.Exists(other));
}

TEST_CASE("node disk: a flusher that cannot start leaves the job in RAM only", "[node_disk]") {
  ScratchDir scratch;
  const std::string file = scratch.path() + "/a-file";
  REQUIRE(CreateNewFile(file, "").ok());
  Node n(false, file + "/persist");  // under a regular file
  n.Save(1);
  n.disk->Committed(1, 1);
  CHECK_FALSE(n.disk->enabled());
  CHECK(n.disk->dir().empty());
  n.disk->Drain(1, false);  // nothing to drain, and no crash
}

}  // namespace
}  // namespace ftrun
