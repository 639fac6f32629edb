// Env contract tests, run against every Env configuration: PosixEnv on the
// real disk and on tmpfs, with and without O_DIRECT and io_uring, with
// O_DIRECT refused at open or at the first write, and FaultEnv over PosixEnv.
#include <memory>
#include <thread>

#include "plugin/persist/fault_env.h"
#include "tests/catch.h"
#include "tests/unit/persist_test_util.h"

namespace ftrun {
namespace {

using Refuse = PosixEnvOptions::RefuseDirect;

struct Case {
  const char* name;
  std::string base;  // filesystem
  PosixEnvOptions options;
  bool fault = false;  // wrap in FaultEnv
};

std::vector<Case> Cases() {
  PosixEnvOptions deflt, plain, open_refused, write_refused, small;
  plain.direct_io = false;
  plain.io_uring = false;
  open_refused.refuse_direct = Refuse::kAtOpen;
  write_refused.refuse_direct = Refuse::kAtWrite;
  small.buffer_size = 8192;  // many buffers per file, all in flight
  small.queue_depth = 3;
  return {{"posix /tmp", "", deflt},
          {"posix /dev/shm", "/dev/shm", deflt},
          {"posix buffered pwrite", "", plain},
          {"posix O_DIRECT refused at open", "/dev/shm", open_refused},
          {"posix O_DIRECT refused at write", "/dev/shm", write_refused},
          {"posix O_DIRECT refused at write, small buffers", "",
           [&] {
             PosixEnvOptions o = small;
             o.refuse_direct = Refuse::kAtWrite;
             return o;
           }()},
          {"posix small buffers", "", small},
          {"fault env over posix", "", deflt, true}};
}

// Writes `data` in appends of irregular sizes, with a Sync in the middle.
void WriteIrregular(Env* env, const std::string& path, const std::string& data, WriteMode* mode) {
  std::unique_ptr<WritableFile> f;
  REQUIRE(env->NewWritableFile(path, &f).ok());
  size_t off = 0, step = 1;
  bool synced_mid = false;
  while (off < data.size()) {
    size_t n = std::min(step, data.size() - off);
    REQUIRE(f->Append(data.data() + off, n).ok());
    off += n;
    step = step * 7 + 3;
    if (!synced_mid && off > data.size() / 2) {
      REQUIRE(f->Sync().ok());  // an unaligned tail mid-file, then more appends
      synced_mid = true;
    }
  }
  Status st = f->Sync();
  INFO(st.ToString());
  REQUIRE(st.ok());
  REQUIRE(f->Close().ok());
  REQUIRE(f->Close().ok());  // twice is fine
  *mode = f->mode();
}

}  // namespace

TEST_CASE("every Env writes and reads back exact bytes", "[persist][env]") {
  for (const Case& c : Cases()) {
    SECTION(c.name) {
      ScratchDir dir(c.base);
      auto posix = NewPosixEnv(c.options);
      std::unique_ptr<Env> fault;
      if (c.fault) fault = std::make_unique<FaultEnv>(posix.get());
      Env* env = c.fault ? fault.get() : posix.get();
      for (size_t size : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{20000},
                          (size_t{1} << 20) - 1, size_t{1} << 20, (size_t{7} << 19) + 123}) {
        const std::string path = dir.path() + "/f" + std::to_string(size);
        const std::string data = Pattern(size, size);
        WriteMode mode;
        WriteIrregular(env, path, data, &mode);
        INFO(c.name << " size " << size << " mode " << mode.ToString());
        uint64_t on_disk = 0;
        REQUIRE(env->GetFileSize(path, &on_disk).ok());
        CHECK(on_disk == size);
        std::string back;
        REQUIRE(env->ReadFile(path, &back).ok());
        CHECK(back == data);
        if (size > 100) {
          std::unique_ptr<RandomAccessFile> r;
          REQUIRE(env->NewRandomAccessFile(path, &r).ok());
          CHECK(r->size() == size);
          std::string part(50, '\0');
          size_t got = 0;
          REQUIRE(r->Read(size - 60, 50, part.data(), &got).ok());
          CHECK(got == 50);
          CHECK(part == data.substr(size - 60, 50));
          REQUIRE(r->Read(size - 10, 50, part.data(), &got).ok());
          CHECK(got == 10);  // short only at the end
        }
        const Refuse refuse = c.options.refuse_direct;
        if (!c.options.direct_io || refuse == Refuse::kAtOpen || (refuse == Refuse::kAtWrite && size > 0)) {
          CHECK_FALSE(mode.direct);
        }
      }
    }
  }
}

TEST_CASE("Env directory calls and their errors", "[persist][env]") {
  ScratchDir dir;
  Env* env = PosixEnv();
  const std::string d = dir.path() + "/sub";
  bool created = false;
  REQUIRE(env->CreateDir(d, &created).ok());
  CHECK(created);
  REQUIRE(env->CreateDir(d, &created).ok());
  CHECK_FALSE(created);
  REQUIRE(env->SyncDir(d).ok());
  bool is_dir = false;
  REQUIRE(env->IsDirectory(d, &is_dir).ok());
  CHECK(is_dir);

  std::unique_ptr<WritableFile> f;
  REQUIRE(env->NewWritableFile(d + "/a.tmp", &f).ok());
  REQUIRE(f->Append("hello", 5).ok());
  REQUIRE(f->Close().ok());
  REQUIRE(env->RenameFile(d + "/a.tmp", d + "/a").ok());
  std::vector<std::string> names;
  REQUIRE(env->ListDir(d, &names).ok());
  CHECK(names == std::vector<std::string>{"a"});
  CHECK(env->FileExists(d + "/a"));
  CHECK_FALSE(env->FileExists(d + "/a.tmp"));
  uint64_t free_bytes = 0;
  CHECK(env->FreeSpace(d, &free_bytes).ok());
  CHECK(free_bytes > 0);

  // Errors name the path and carry strerror; a missing file is kNotFound.
  uint64_t size = 0;
  Status st = env->GetFileSize(d + "/nope", &size);
  CHECK(st.code() == Code::kNotFound);
  CHECK(Contains(st.message(), d + "/nope"));
  CHECK(Contains(st.message(), "No such file or directory"));
  st = env->NewWritableFile(d + "/missing/x", &f);
  CHECK(st.code() == Code::kNotFound);
  CHECK(Contains(st.message(), "cannot create '" + d + "/missing/x'"));
  st = env->DeleteDir(d);
  CHECK(st.code() == Code::kIoError);
  CHECK(Contains(st.message(), "Directory not empty"));
  st = env->CreateDir(d + "/a");  // a file is in the way
  CHECK(Contains(st.message(), "Not a directory"));
  std::string bytes;
  CHECK(env->ReadFile(d, &bytes).code() == Code::kIoError);  // a directory

  REQUIRE(DeleteTree(env, d).ok());
  CHECK_FALSE(env->FileExists(d));
  CHECK(DeleteTree(env, d).ok());  // missing is fine
}

TEST_CASE("O_DIRECT is used on the real disk", "[persist][env]") {
  ScratchDir dir;
  long type = FsType(dir.path());
  if (type != kExt4Magic && type != kXfsMagic) {
    WARN("scratch dir " << dir.path() << " is not ext4/xfs (f_type " << type << "); skipped");
    return;
  }
  std::unique_ptr<WritableFile> f;
  REQUIRE(PosixEnv()->NewWritableFile(dir.path() + "/d", &f).ok());
  std::string data = Pattern(3, (3u << 20) + 5);
  REQUIRE(f->Append(data.data(), data.size()).ok());
  REQUIRE(f->Sync().ok());
  REQUIRE(f->Close().ok());
  WriteMode mode = f->mode();
  INFO(mode.ToString());
  CHECK(mode.direct);
  if (mode.queue_depth == 0) WARN("io_uring not available here: pwrite was used");
  std::string back;
  REQUIRE(PosixEnv()->ReadFile(dir.path() + "/d", &back).ok());
  CHECK(back == data);
}

TEST_CASE("a filesystem that refuses O_DIRECT falls back to buffered writes", "[persist][env]") {
  ScratchDir dir("/dev/shm");
  for (Refuse refuse : {Refuse::kAtOpen, Refuse::kAtWrite}) {
    PosixEnvOptions o;
    o.refuse_direct = refuse;
    auto env = NewPosixEnv(o);
    std::unique_ptr<WritableFile> f;
    REQUIRE(env->NewWritableFile(dir.path() + "/x", &f).ok());
    if (refuse == Refuse::kAtOpen) CHECK_FALSE(f->mode().direct);
    if (refuse == Refuse::kAtWrite) CHECK(f->mode().direct);  // until the first write says otherwise
    std::string data = Pattern(9, (5u << 20) + 77);           // several writes in flight fail at once
    REQUIRE(f->Append(data.data(), data.size()).ok());
    REQUIRE(f->Close().ok());
    CHECK_FALSE(f->mode().direct);
    std::string back;
    REQUIRE(env->ReadFile(dir.path() + "/x", &back).ok());
    CHECK(back == data);
  }
  // Without a fault, this kernel's tmpfs may well accept O_DIRECT (Linux >= 6.6).
  std::unique_ptr<WritableFile> f;
  REQUIRE(PosixEnv()->NewWritableFile(dir.path() + "/y", &f).ok());
  REQUIRE(f->Append("abc", 3).ok());
  REQUIRE(f->Close().ok());
  std::string back;
  REQUIRE(PosixEnv()->ReadFile(dir.path() + "/y", &back).ok());
  CHECK(back == "abc");
}

TEST_CASE("files written at the same time from several threads stay apart", "[persist][env]") {
  ScratchDir dir;
  PosixEnvOptions o;
  o.buffer_size = 64 << 10;
  auto env = NewPosixEnv(o);
  std::vector<std::thread> threads;
  std::vector<int> ok(6, 0);
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        std::string path = dir.path() + "/t" + std::to_string(t) + "_" + std::to_string(i);
        std::string data = Pattern(t * 100 + i, 300000 + t * 1000 + i);
        std::unique_ptr<WritableFile> f;
        if (!env->NewWritableFile(path, &f).ok()) return;
        for (size_t off = 0; off < data.size(); off += 10007) {
          if (!f->Append(data.data() + off, std::min<size_t>(10007, data.size() - off)).ok()) return;
        }
        if (!f->Sync().ok() || !f->Close().ok()) return;
        std::string back;
        if (!env->ReadFile(path, &back).ok() || back != data) return;
      }
      ok[t] = 1;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(ok == std::vector<int>(6, 1));
}

}  // namespace ftrun
