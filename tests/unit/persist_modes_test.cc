// Issue 13, "Disk: one timeline, always", the smaller items: files and
// directories under persist.dir are private by default (persist.file_mode
// widens them for a group), the persist root is checked before ftrun writes
// into it, corrupt chunk lengths in a disk manifest are refused, and the
// allocator's rounding does not wrap near 2^64. Real files.
#include <sys/stat.h>
#include <unistd.h>

#include "plugin/config/config.h"
#include "plugin/persist/disk_format.h"
#include "plugin/persist/persist_reader.h"
#include "plugin/store/extent_allocator.h"
#include "plugin/store/snapshot_store.h"
#include "tests/catch.h"
#include "tests/unit/persist_test_util.h"

namespace ftrun {
namespace {

uint32_t ModeOf(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

// Every file and directory under `root` with its mode (tmp files included).
void CheckModes(const std::string& root, uint32_t file_mode, uint32_t dir_mode) {
  std::vector<std::string> todo{root};
  int files = 0;
  while (!todo.empty()) {
    std::string d = todo.back();
    todo.pop_back();
    INFO("directory " << d);
    CHECK(ModeOf(d) == dir_mode);
    std::vector<std::string> names;
    REQUIRE(PosixEnv()->ListDir(d, &names).ok());
    for (const auto& n : names) {
      bool is_dir = false;
      REQUIRE(PosixEnv()->IsDirectory(d + "/" + n, &is_dir).ok());
      if (is_dir) {
        todo.push_back(d + "/" + n);
      } else {
        INFO("file " << d << "/" << n);
        CHECK(ModeOf(d + "/" + n) == file_mode);
        ++files;
      }
    }
  }
  CHECK(files > 3);  // manifests, markers, chunks
}

}  // namespace

TEST_CASE("persist files are 0600 and directories 0700 by default, whatever the umask", "[persist][security]") {
  ScratchDir dir;
  ChunkBank bank;
  mode_t old_umask = ::umask(0);  // the mode is set explicitly, not left to the umask
  std::unique_ptr<Env> env = NewPosixEnv(PosixEnvOptions());
  std::vector<Manifest> ms = {bank.Build(0, 1, {{"w", 100000, 1}})};
  PersistWriter w(WriterOptions(env.get(), dir.path() + "/persist", "job", 1));
  Status st = w.WriteVersion(1, Ptrs(ms), bank.Source());
  ::umask(old_umask);
  REQUIRE(st.ok());
  CheckModes(dir.path() + "/persist", 0600, 0700);
  CHECK(CheckPersistRoot(dir.path() + "/persist", "job", 0600).ok());
}

TEST_CASE("persist.file_mode widens files and directories for a group", "[persist][security]") {
  Config c;
  REQUIRE(ParseConfig("persist:\n  dir: /d\n  every_versions: 1\n  file_mode: \"0640\"\n", "x.yaml", &c).ok());
  CHECK(c.persist.file_mode == 0640);
  CHECK(DirModeFor(c.persist.file_mode) == 0750);
  CHECK(DirModeFor(0660) == 0770);
  for (const char* bad : {"0644", "0666", "0700", "0400", "rw", "06000"}) {
    INFO(bad);
    Status s = ParseConfig(std::string("persist:\n  file_mode: \"") + bad + "\"\n", "x.yaml", &c);
    CHECK_FALSE(s.ok());
    CHECK(Contains(s.message(), "persist.file_mode"));
  }
  ScratchDir dir;
  ChunkBank bank;
  mode_t old_umask = ::umask(077);  // a strict umask does not narrow the configured mode
  PosixEnvOptions eo;
  eo.file_mode = 0660;
  eo.dir_mode = DirModeFor(0660);
  std::unique_ptr<Env> env = NewPosixEnv(eo);
  std::vector<Manifest> ms = {bank.Build(0, 1, {{"w", 100000, 1}})};
  PersistWriter w(WriterOptions(env.get(), dir.path() + "/persist", "job", 1));
  Status st = w.WriteVersion(1, Ptrs(ms), bank.Source());
  ::umask(old_umask);
  REQUIRE(st.ok());
  CheckModes(dir.path() + "/persist", 0660, 0770);
}

TEST_CASE("the persist root is refused when others can write it or it is group-writable and private",
          "[persist][security]") {
  ScratchDir dir;
  const std::string root = dir.path() + "/persist";
  REQUIRE(::mkdir(root.c_str(), 0700) == 0);
  CHECK(CheckPersistRoot(root, "job", 0600).ok());
  CHECK(CheckPersistRoot(root + "/missing", "job", 0600).ok());  // created (0700) inside a private one
  REQUIRE(::chmod(root.c_str(), 0770) == 0);
  Status s = CheckPersistRoot(root, "job", 0600);
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK(Contains(s.message(), "'" + root + "' (mode 0770) can be written by its group"));
  CHECK(CheckPersistRoot(root, "job", 0660).ok());  // a group-shared directory
  REQUIRE(::chmod(root.c_str(), 0777) == 0);
  s = CheckPersistRoot(root, "job", 0660);
  CHECK(Contains(s.message(), "'" + root + "' (mode 0777) can be written by any user"));
  s = CheckPersistRoot(root + "/missing", "job", 0600);  // its parent, not sticky
  CHECK(Contains(s.message(), "can be written by any user"));
  // Like /tmp or a fresh tmpfs (1777): fine while the job's directory is
  // ftrun's own; one that another user could have made is refused.
  REQUIRE(::chmod(root.c_str(), 01777) == 0);
  CHECK(CheckPersistRoot(root, "job", 0600).ok());
  CHECK(CheckPersistRoot(root + "/missing", "job", 0600).ok());
  const std::string job = root + "/job";
  REQUIRE(::mkdir(job.c_str(), 0700) == 0);
  REQUIRE(::chmod(job.c_str(), 0777) == 0);
  s = CheckPersistRoot(root, "job", 0600);
  CHECK(Contains(s.message(), "'" + job + "' (in a directory any user can write) is writable by others"));
  REQUIRE(::rmdir(job.c_str()) == 0);
  REQUIRE(::symlink(dir.path().c_str(), job.c_str()) == 0);
  s = CheckPersistRoot(root, "job", 0600);
  CHECK(Contains(s.message(), "'" + job + "' (in a directory any user can write) is a symlink"));
}

TEST_CASE("a disk manifest with a chunk length past any chunk size is refused, naming file and field",
          "[persist][security]") {
  ScratchDir dir;
  ChunkBank bank;
  const std::string root = dir.path() + "/persist";
  Manifest m = bank.Build(0, 6, {{"w", 1000, 1}});
  PersistWriter w(WriterOptions(PosixEnv(), root, "job", 1));
  std::vector<Manifest> ms = {m};
  REQUIRE(w.WriteVersion(6, Ptrs(ms), bank.Source()).ok());
  // A manifest file that claims a chunk of 2^62 bytes (a tensor of that
  // many uint8s: every other structural check passes), with a marker that
  // matches it: a torn or hostile directory. The store would be asked to
  // reserve it and the reader to read that much into it.
  Manifest bad = m;
  const uint64_t huge = 1ull << 62;
  bad.tensors[0].info.nbytes = huge;
  bad.tensors[0].info.shape = {static_cast<int64_t>(huge)};
  bad.tensors[0].chunks[0].length = huge;
  std::string bytes = EncodeManifestFile("job", 1, bad);
  ManifestFile f;
  Status st = DecodeManifestFile(bytes, "p/rank0.manifest", &f);
  INFO(st.ToString());
  CHECK(st.code() == Code::kCorruption);
  CHECK(Contains(st.message(), "'p/rank0.manifest'"));
  CHECK(Contains(st.message(), "tensor 'w' chunk #0 field 'length' is " + std::to_string(huge) + " bytes"));
  // And through the reader, with the marker made to match.
  const std::string vdir = VersionDir(root + "/job", 6);
  NodeMarker nm{"job", 1, 6, 0, {{0, bytes.size(), FileChecksum(bytes)}}};
  std::string marker = EncodeNodeMarker(nm);
  for (const auto& [name, data] : {std::pair<std::string, std::string>{"rank0.manifest", bytes},
                                   std::pair<std::string, std::string>{"node0.COMPLETE", marker}}) {
    REQUIRE(PosixEnv()->DeleteFile(vdir + "/" + name).ok());
    std::unique_ptr<WritableFile> out;
    REQUIRE(PosixEnv()->NewWritableFile(vdir + "/" + name, &out).ok());
    REQUIRE(out->Append(data.data(), data.size()).ok());
    REQUIRE(out->Close().ok());
  }
  PersistReader r(nullptr, root, "job", 1);
  std::vector<Manifest> loaded;
  Status ls = r.LoadVersion(6, nullptr, &loaded);
  INFO(ls.ToString());
  CHECK_FALSE(ls.ok());
  CHECK(Contains(ls.message(), vdir + "/rank0.manifest"));
  CHECK(Contains(ls.message(), "field 'length'"));
}

TEST_CASE("rounding a length near 2^64 is refused, never wrapped", "[store][security]") {
  CHECK(ExtentAllocator::Rounded(0) == std::optional<uint64_t>(0));
  CHECK(ExtentAllocator::Rounded(1) == std::optional<uint64_t>(4096));
  CHECK(ExtentAllocator::Rounded(UINT64_MAX - 4095) == std::optional<uint64_t>(UINT64_MAX - 4095));
  CHECK_FALSE(ExtentAllocator::Rounded(UINT64_MAX - 4094).has_value());
  CHECK_FALSE(ExtentAllocator::Rounded(UINT64_MAX).has_value());
  ExtentAllocator a(0, 1 << 20);
  CHECK_FALSE(a.Allocate(UINT64_MAX - 100).has_value());  // wrapped, it fit in 0 bytes
  CHECK(a.used() == 0);
  SnapshotStore store(0, 1 << 20, "store.memory_budget");
  std::vector<uint64_t> offsets;
  Status s = store.Reserve(1, {4096, UINT64_MAX - 10}, &offsets);
  CHECK_FALSE(s.ok());
  CHECK(offsets.empty());
}

}  // namespace ftrun
