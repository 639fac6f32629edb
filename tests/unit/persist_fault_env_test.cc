// FaultEnv itself: what a crash keeps and drops, write errors, bit flips.
#include <cerrno>

#include "plugin/persist/fault_env.h"
#include "tests/catch.h"
#include "tests/unit/persist_test_util.h"

namespace ftrun {
namespace {

Status Write(Env* env, const std::string& path, const std::string& data, bool sync) {
  std::unique_ptr<WritableFile> f;
  FTRUN_RETURN_IF_ERROR(env->NewWritableFile(path, &f));
  FTRUN_RETURN_IF_ERROR(f->Append(data.data(), data.size()));
  if (sync) FTRUN_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

std::string Read(Env* env, const std::string& path) {
  std::string s;
  return env->ReadFile(path, &s).ok() ? s : "<missing>";
}

}  // namespace

TEST_CASE("a crash drops bytes appended since the last sync", "[persist][fault]") {
  ScratchDir dir("/dev/shm");
  FaultEnv env(PosixEnv());
  const std::string p = dir.path() + "/f";
  std::unique_ptr<WritableFile> f;
  REQUIRE(env.NewWritableFile(p, &f).ok());
  REQUIRE(env.SyncDir(dir.path()).ok());
  REQUIRE(f->Append("0123456789", 10).ok());
  REQUIRE(f->Sync().ok());
  REQUIRE(f->Append("abcde", 5).ok());
  REQUIRE(f->Close().ok());
  CHECK(Read(&env, p) == "0123456789abcde");
  REQUIRE(env.Crash().ok());
  CHECK(Read(&env, p) == "0123456789");
}

TEST_CASE("a crash drops names no directory sync made durable", "[persist][fault]") {
  ScratchDir dir("/dev/shm");
  FaultEnv env(PosixEnv());
  const std::string d = dir.path();
  REQUIRE(Write(&env, d + "/unsynced_name", "x", true).ok());
  REQUIRE(env.CreateDir(d + "/newdir").ok());
  REQUIRE(Write(&env, d + "/newdir/inner", "y", true).ok());
  REQUIRE(env.SyncDir(d + "/newdir").ok());  // inner is durable in newdir, newdir itself is not
  REQUIRE(env.Crash().ok());
  CHECK_FALSE(env.FileExists(d + "/unsynced_name"));
  CHECK_FALSE(env.FileExists(d + "/newdir"));

  REQUIRE(Write(&env, d + "/kept", "z", true).ok());
  REQUIRE(env.SyncDir(d).ok());
  REQUIRE(env.Crash().ok());
  CHECK(Read(&env, d + "/kept") == "z");
}

TEST_CASE("a rename is undone by a crash until its directory is synced", "[persist][fault]") {
  ScratchDir dir("/dev/shm");
  FaultEnv env(PosixEnv());
  const std::string d = dir.path();
  // Both names durable, then a rename over the target, not synced.
  REQUIRE(Write(&env, d + "/target", "old", true).ok());
  REQUIRE(Write(&env, d + "/source", "new", true).ok());
  REQUIRE(env.SyncDir(d).ok());
  REQUIRE(env.RenameFile(d + "/source", d + "/target").ok());
  CHECK(Read(&env, d + "/target") == "new");
  REQUIRE(env.Crash().ok());
  CHECK(Read(&env, d + "/target") == "old");
  CHECK(Read(&env, d + "/source") == "new");

  // tmp + sync + rename + dir sync survives.
  REQUIRE(Write(&env, d + "/t.tmp", "final", true).ok());
  REQUIRE(env.RenameFile(d + "/t.tmp", d + "/t").ok());
  REQUIRE(env.SyncDir(d).ok());
  REQUIRE(env.Crash().ok());
  CHECK(Read(&env, d + "/t") == "final");
  CHECK_FALSE(env.FileExists(d + "/t.tmp"));

  // A rename of an unsynced file, then a dir sync: the name survives, torn.
  REQUIRE(Write(&env, d + "/u.tmp", "unsynced", false).ok());
  REQUIRE(env.RenameFile(d + "/u.tmp", d + "/u").ok());
  REQUIRE(env.SyncDir(d).ok());
  REQUIRE(env.Crash().ok());
  CHECK(Read(&env, d + "/u").empty());
}

TEST_CASE("CrashAfter lets n calls through and fails the rest", "[persist][fault]") {
  ScratchDir dir("/dev/shm");
  FaultEnv env(PosixEnv());
  uint64_t before = env.ops();
  env.CrashAfter(2);
  std::unique_ptr<WritableFile> f;
  REQUIRE(env.NewWritableFile(dir.path() + "/a", &f).ok());  // 1
  REQUIRE(f->Append("x", 1).ok());                           // 2
  Status st = f->Sync();
  CHECK(st.code() == Code::kIoError);
  CHECK(Contains(st.message(), "simulated crash"));
  CHECK(env.crashed());
  CHECK(env.CreateDir(dir.path() + "/b").code() == Code::kIoError);
  CHECK(env.ops() - before == 2);
  REQUIRE(env.Crash().ok());
  CHECK_FALSE(env.crashed());
  CHECK(env.CreateDir(dir.path() + "/b").ok());
}

TEST_CASE("ENOSPC after a number of bytes, then space comes back", "[persist][fault]") {
  ScratchDir dir("/dev/shm");
  FaultEnv env(PosixEnv());
  env.FailWrites(WriteFault{ENOSPC, 10, 1.0, 1});
  std::unique_ptr<WritableFile> f;
  REQUIRE(env.NewWritableFile(dir.path() + "/a", &f).ok());  // nothing used up yet
  REQUIRE(f->Append("0123456", 7).ok());
  Status st = f->Append("789abc", 6);  // a short write: 3 bytes fit
  CHECK(st.code() == Code::kIoError);
  CHECK(Contains(st.message(), dir.path() + "/a"));
  CHECK(Contains(st.message(), "No space left on device"));
  CHECK(f->Sync().code() == Code::kIoError);
  REQUIRE(f->Close().ok());
  CHECK(Read(&env, dir.path() + "/a") == "0123456789");
  CHECK(env.CreateDir(dir.path() + "/d").code() == Code::kIoError);
  CHECK(env.DeleteFile(dir.path() + "/a").ok());  // deleting always works
  CHECK(env.failed_writes() >= 3);
  env.ClearWriteFaults();
  CHECK(Write(&env, dir.path() + "/b", "fine", true).ok());
}

TEST_CASE("EIO with a seeded probability is repeatable", "[persist][fault]") {
  ScratchDir dir("/dev/shm");
  auto run = [&](uint64_t seed) {
    FaultEnv env(PosixEnv());
    env.FailWrites(WriteFault{EIO, 0, 0.3, seed});
    std::string pattern;
    for (int i = 0; i < 200; ++i) {
      Status st = env.CreateDir(dir.path() + "/d" + std::to_string(i));
      if (!st.ok()) CHECK(Contains(st.message(), "Input/output error"));
      pattern += st.ok() ? '.' : 'X';
    }
    for (int i = 0; i < 200; ++i) (void)env.DeleteDir(dir.path() + "/d" + std::to_string(i));
    return pattern;
  };
  std::string a = run(7), b = run(7), c = run(8);
  CHECK(a == b);
  CHECK(a != c);
  auto fails = std::count(a.begin(), a.end(), 'X');
  CHECK(fails > 30);
  CHECK(fails < 90);
}

TEST_CASE("bit flips on read and on disk", "[persist][fault]") {
  ScratchDir dir("/dev/shm");
  FaultEnv env(PosixEnv());
  const std::string p = dir.path() + "/f";
  REQUIRE(Write(&env, p, "AAAAAAAA", true).ok());
  env.FlipBitOnRead(p, 3, 0);
  CHECK(Read(&env, p) == "AAA@AAAA");        // 'A' ^ 1 == '@'
  CHECK(Read(PosixEnv(), p) == "AAAAAAAA");  // the file itself is intact
  std::unique_ptr<RandomAccessFile> r;
  REQUIRE(env.NewRandomAccessFile(p, &r).ok());
  char buf[4];
  size_t got = 0;
  REQUIRE(r->Read(2, 4, buf, &got).ok());
  CHECK(std::string(buf, 4) == "A@AA");
  env.ClearReadFlips();
  CHECK(Read(&env, p) == "AAAAAAAA");

  REQUIRE(env.FlipBitOnDisk(p, 0, 1).ok());
  CHECK(Read(PosixEnv(), p) == "CAAAAAAA");  // 'A' ^ 2 == 'C'
  CHECK(env.FlipBitOnDisk(p, 99, 0).code() == Code::kInvalidArgument);
}

}  // namespace ftrun
