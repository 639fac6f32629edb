// RendezvousKeeper with real child processes standing in for the Python
// store (a shell script as "python"): the address is taken only from a
// well-formed "listening <port>" line, and forgotten when the child exits.
#include "launcher/runner/rendezvous_keeper.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "tests/catch.h"

namespace ftrun {
namespace {

// A "python" that prints `out` and then runs `then` (a shell command; removed
// with the object).
struct FakePython {
  FakePython(const std::string& out, int sleep_s) : FakePython(out, "sleep " + std::to_string(sleep_s), 0) {}
  FakePython(const std::string& out, const std::string& then, int) {
    char d[] = "/tmp/ftrun-keeper-XXXXXX";
    REQUIRE(::mkdtemp(d) != nullptr);
    dir = d;
    path = dir + "/python";
    std::ofstream(path) << "#!/bin/sh\nprintf '" << out << "'\n" << then << "\n";
    REQUIRE(::chmod(path.c_str(), 0700) == 0);
  }
  ~FakePython() {
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());
  }
  std::string dir, path;
};

// Polls for up to 5 s until `done`.
template <typename F>
void PollUntil(RendezvousKeeper& k, F done) {
  for (int i = 0; i < 500 && !done(); ++i) {
    k.Poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Polls until the keeper's child has exited (not reaped), and once more:
// all it printed is read.
void PollUntilExited(RendezvousKeeper& k) {
  siginfo_t info{};
  PollUntil(k, [&] {
    info.si_pid = 0;
    return ::waitid(P_PID, static_cast<id_t>(k.pid()), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid != 0;
  });
  k.Poll();
}

// Waits for the keeper's child and hands its exit to the keeper.
bool ReapIt(RendezvousKeeper& k) {
  int status = 0;
  const pid_t pid = k.pid();
  if (::waitpid(pid, &status, 0) != pid) return false;
  ExitInfo info;
  info.signaled = WIFSIGNALED(status);
  info.code = info.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
  return k.Reaped(pid, info);
}

}  // namespace

TEST_CASE("rendezvous keeper: the address once it says it listens, none after it exits", "[rendezvous_keeper]") {
  RendezvousKeeper k;
  FakePython py("listening 4242\\n", 1);
  REQUIRE(k.Start(py.path, "10.0.0.9").ok());
  CHECK(k.fresh().empty());
  PollUntil(k, [&] { return !k.fresh().empty(); });
  CHECK(k.fresh() == "10.0.0.9:4242");
  CHECK_FALSE(k.Reaped(k.pid() + 1, ExitInfo{}));  // not its child
  CHECK(k.fresh() == "10.0.0.9:4242");
  REQUIRE(ReapIt(k));
  CHECK(k.fresh().empty());
  CHECK(k.Take().empty());
  CHECK(k.pid() == 0);
}

TEST_CASE("rendezvous keeper: each generation gets a store no generation used before", "[rendezvous_keeper]") {
  // A store that makes the next server (port + 1) each time it reads "next".
  RendezvousKeeper k;
  FakePython py("listening 5000\\n",
                "p=5001; while read l; do [ \"$l\" = next ] && printf 'listening %d\\n' $p; p=$((p+1)); done", 0);
  REQUIRE(k.Start(py.path, "h").ok());
  PollUntil(k, [&] { return !k.fresh().empty(); });
  REQUIRE(k.Take() == "h:5000");
  CHECK(k.current() == "h:5000");
  CHECK(k.fresh().empty());
  CHECK(k.Take().empty());  // the next one not up yet: that generation's rank 0 hosts its store
  CHECK(k.current() == "h:5000");
  PollUntil(k, [&] { return !k.fresh().empty(); });
  CHECK(k.fresh() == "h:5001");
  CHECK(k.Take() == "h:5001");
  PollUntil(k, [&] { return !k.fresh().empty(); });
  CHECK(k.Take() == "h:5002");
  CHECK(k.current() == "h:5002");
  ::kill(k.pid(), SIGKILL);
  REQUIRE(ReapIt(k));
  CHECK(k.current().empty());
}

TEST_CASE("rendezvous keeper: a line that is not 'listening <port>' is never an address", "[rendezvous_keeper]") {
  for (const char* out : {"listening 99999\\n", "listening 0\\n", "listening 12ab\\n", "hello\\n", "listening\\n"}) {
    RendezvousKeeper k;
    FakePython py(out, 0);
    REQUIRE(k.Start(py.path, "h").ok());
    PollUntilExited(k);
    CHECK(k.fresh().empty());
    REQUIRE(ReapIt(k));
  }
  // Nothing but an endless line: stops reading after 4 KiB.
  RendezvousKeeper k;
  FakePython py(std::string(8192, 'x'), 0);
  REQUIRE(k.Start(py.path, "h").ok());
  PollUntilExited(k);
  CHECK(k.fresh().empty());
  REQUIRE(ReapIt(k));
}

}  // namespace ftrun
