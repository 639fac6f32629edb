// Issue 13, "the node": the store segment is sealed against resizing, the
// agent's socket reads are bounded, and the standby's cgroup paths are
// checked before anything is written to them.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>

#include "launcher/agent/cgroup_join.h"
#include "launcher/agent/connection.h"
#include "plugin/ipc/wire.h"
#include "plugin/store/arena.h"
#include "tests/catch.h"

using namespace ftrun;

TEST_CASE("the store segment cannot be resized or resealed, through any descriptor", "[security][store]") {
  Arena arena;
  REQUIRE(Arena::Create("sealed", 0, 1 << 20, 1 << 16, &arena).ok());
  CHECK(::ftruncate(arena.fd(), 0) == -1);
  CHECK(errno == EPERM);
  CHECK(::ftruncate(arena.fd(), 2 << 20) == -1);
  CHECK(errno == EPERM);
  // What another process of the same uid gets: the fd reopened through /proc.
  std::string proc = "/proc/self/fd/" + std::to_string(arena.fd());
  UniqueFd again(::open(proc.c_str(), O_RDWR | O_CLOEXEC));
  REQUIRE(again.valid());
  CHECK(::ftruncate(again.get(), 4096) == -1);
  CHECK(errno == EPERM);
  CHECK(::fcntl(again.get(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == -1);
  CHECK(errno == EPERM);
  CHECK(arena.base()[0] != 0);  // the mapping is intact (no SIGBUS)
  // A rank maps it as before.
  Arena rank;
  REQUIRE(Arena::Attach(UniqueFd(::dup(arena.fd())), "sealed", &rank).ok());
  CHECK(rank.size() == arena.size());
}

TEST_CASE("a rank refuses a store segment that is not sealed", "[security][store]") {
  UniqueFd fd(::memfd_create("unsealed", MFD_CLOEXEC));
  REQUIRE(::ftruncate(fd.get(), 1 << 20) == 0);
  Arena a;
  Status s = Arena::Attach(std::move(fd), "", &a);
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Contains("not sealed"));
}

namespace {
void Pair(UniqueFd* a, UniqueFd* b) {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
  a->Reset(sv[0]);
  b->Reset(sv[1]);
}
std::string Frame(MsgType type, const std::string& payload, uint32_t length) {
  FrameHeader h{kFrameMagic, static_cast<uint16_t>(type), 0, length};
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h)) + payload;
}
}  // namespace

TEST_CASE("FrameReader takes at most its budget per read", "[security][wire]") {
  UniqueFd a, b;
  Pair(&a, &b);
  std::string many;
  for (int i = 0; i < 2000; ++i) many += Frame(MsgType::kProgress, "12345678", 8);
  REQUIRE(::write(a.get(), many.data(), many.size()) == static_cast<ssize_t>(many.size()));
  FrameReader r;
  MsgType type;
  std::string payload;
  int frames = 0, reads = 0;
  while (frames < 2000) {
    REQUIRE(r.ReadFrom(b.get(), 4096).ok());
    ++reads;
    int now = 0;
    while (r.Next(&type, &payload)) ++now;
    CHECK(now <= 4096 / 20 + 1);  // the budget's worth, and the frame it ended in
    frames += now;
    REQUIRE(reads < 100);
  }
  CHECK(frames == 2000);
  CHECK(reads >= static_cast<int>(many.size() / 4096));
}

TEST_CASE("an oversized frame is refused at its header, before its payload", "[security][wire]") {
  UniqueFd a, b;
  Pair(&a, &b);
  std::string hdr = Frame(MsgType::kSave, "", 200u << 20);
  REQUIRE(::write(a.get(), hdr.data(), hdr.size()) == static_cast<ssize_t>(hdr.size()));
  FrameReader r;
  r.set_max_frame(Connection::kMaxRankFrame);
  REQUIRE(r.ReadFrom(b.get()).ok());
  MsgType type;
  std::string payload;
  CHECK_FALSE(r.Next(&type, &payload));
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK_THAT(r.status().message(), Catch::Contains("209715200-byte frame") && Catch::Contains("limit"));
}

TEST_CASE("a descriptor comes out with the frame it was sent with", "[security][wire]") {
  UniqueFd a, b;
  Pair(&a, &b);
  int p[2];
  REQUIRE(::pipe(p) == 0);
  UniqueFd pr(p[0]), pw(p[1]);
  REQUIRE(SendFrame(a.get(), MsgType::kAttachSignal, "x").ok());
  REQUIRE(SendFrame(a.get(), MsgType::kAttachFd, "", pw.get()).ok());
  FrameReader r;
  r.set_accept_fds(true);
  REQUIRE(r.ReadFrom(b.get()).ok());
  MsgType type;
  std::string payload;
  UniqueFd first, second;
  REQUIRE(r.Next(&type, &payload, &first));
  CHECK_FALSE(first.valid());
  REQUIRE(r.Next(&type, &payload, &second));
  CHECK(type == MsgType::kAttachFd);
  REQUIRE(second.valid());
  REQUIRE(::write(second.get(), "y", 1) == 1);
  char c = 0;
  REQUIRE(::read(pr.get(), &c, 1) == 1);
  CHECK(c == 'y');
}

TEST_CASE("a connection that floods the agent is cut off", "[security][agent]") {
  Connection conn;
  auto t0 = std::chrono::steady_clock::now();
  Status s;
  uint64_t n = 0;
  while (s.ok() && n <= Connection::kMaxFramesPerSecond) s = conn.Received(t0, 20), ++n;
  CHECK(s.code() == Code::kResourceExhausted);
  CHECK_THAT(s.message(), Catch::Contains("flooding"));
  // A rank at work (a few frames a step) is never near it.
  Connection calm;
  for (int i = 0; i < 1000; ++i) REQUIRE(calm.Received(t0 + std::chrono::seconds(i), 1 << 20).ok());
}

TEST_CASE("cgroup v2 paths from /proc/<pid>/cgroup are checked", "[security][standby]") {
  std::string p;
  REQUIRE(ParseCgroupV2Path(
              "12:memory:/slurm/uid_1000/job_5\n0::/system.slice/slurmstepd.scope/job_5/step_0/user/task_0\n", &p)
              .ok());
  CHECK(p == "/system.slice/slurmstepd.scope/job_5/step_0/user/task_0");
  REQUIRE(ParseCgroupV2Path("0::/\n", &p).ok());
  CHECK(p == "/");
  CHECK(ParseCgroupV2Path("4:memory:/job\n3:devices:/job\n", &p).code() == Code::kNotFound);
  CHECK(ParseCgroupV2Path("0::/a/../../etc\n", &p).code() == Code::kInvalidArgument);
  CHECK(ParseCgroupV2Path("0::relative\n", &p).code() == Code::kInvalidArgument);
  CHECK(ParseCgroupV2Path("0::/a/./b\n", &p).code() == Code::kInvalidArgument);
  CHECK(ParseCgroupV2Path(std::string("0::/a\x01") + "b\n", &p).code() == Code::kInvalidArgument);
  CHECK(ParseCgroupV2Path("0::/job_5 (deleted)\n", &p).code() == Code::kNotFound);

  std::string dir;
  CHECK(ResolveCgroupDir("/tmp", "/x", &dir).code() == Code::kInvalidArgument);
  // Wherever it resolves, a directory that is not a cgroup v2 one is refused.
  Status s = ResolveCgroupDir("/sys/fs/cgroup", "/nonexistent-ftrun-test", &dir);
  CHECK_FALSE(s.ok());
}
