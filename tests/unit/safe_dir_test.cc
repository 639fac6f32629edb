// The run directory's rules (plugin/common/safe_dir.h, default_run_dir.h,
// proc_start.h) on real directories, files, links and processes. CI runs as
// root: a foreign owner is uid 65534 (nobody), set with chown.
#include "plugin/common/safe_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "launcher/agent/instance_lock.h"
#include "plugin/common/proc_start.h"
#include "plugin/config/config.h"
#include "tests/catch.h"

using namespace ftrun;

namespace {

constexpr uid_t kNobody = 65534;

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/ftrun-safedir-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { (void)!std::system(("rm -rf '" + path + "'").c_str()); }
};

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("the default run dir is per user: XDG_RUNTIME_DIR, /run/user/<uid>, /tmp/ftrun-<uid>", "[security]") {
  TempDir t;
  const uid_t me = ::geteuid();
  const std::string run_user = t.path + "/run-user";
  REQUIRE(::mkdir(run_user.c_str(), 0755) == 0);
  // Nothing usable: /tmp/ftrun-<uid>, different for two users.
  CHECK(ChooseRunDir(nullptr, me, run_user) == "/tmp/ftrun-" + std::to_string(me));
  CHECK(ChooseRunDir(nullptr, me, run_user) != ChooseRunDir(nullptr, kNobody, run_user));
  // /run/user/<uid> when it is the user's own.
  const std::string mine = run_user + "/" + std::to_string(me);
  REQUIRE(::mkdir(mine.c_str(), 0700) == 0);
  CHECK(ChooseRunDir(nullptr, me, run_user) == mine + "/ftrun");
  CHECK(ChooseRunDir(nullptr, kNobody, run_user) == "/tmp/ftrun-65534");
  // XDG_RUNTIME_DIR first, when usable.
  const std::string xdg = t.path + "/xdg";
  REQUIRE(::mkdir(xdg.c_str(), 0700) == 0);
  CHECK(ChooseRunDir(xdg.c_str(), me, run_user) == xdg + "/ftrun");
  CHECK(ChooseRunDir("relative/xdg", me, run_user) == mine + "/ftrun");
  ::chmod(xdg.c_str(), 0777);  // shared: not usable
  CHECK(ChooseRunDir(xdg.c_str(), me, run_user) == mine + "/ftrun");
  ::chmod(xdg.c_str(), 0700);
  if (me == 0) {
    REQUIRE(::chown(xdg.c_str(), kNobody, kNobody) == 0);  // another user's
    CHECK(ChooseRunDir(xdg.c_str(), me, run_user) == mine + "/ftrun");
  }
  // The built-in default is never the shared /tmp/ftrun.
  CHECK(DefaultConfig().agent.run_dir != "/tmp/ftrun");
  CHECK(DefaultRunDir() == DefaultConfig().agent.run_dir);
}

TEST_CASE("OpenPrivateDir creates 0700 and refuses links, foreign and shared directories, naming them", "[security]") {
  TempDir t;
  UniqueFd fd;
  const std::string made = t.path + "/a/b/run";
  REQUIRE(OpenPrivateDir(made, true, "agent.run_dir", &fd).ok());
  struct stat st {};
  REQUIRE(::stat(made.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  CHECK(OpenPrivateDir(made, false, "agent.run_dir", &fd).ok());
  CHECK(OpenPrivateDir(made + "/../run", false, "agent.run_dir", &fd).ok());

  // The directory itself a symlink (to a directory of ours): refused.
  const std::string link = t.path + "/link";
  REQUIRE(::symlink(made.c_str(), link.c_str()) == 0);
  Status s = OpenPrivateDir(link, true, "agent.run_dir", &fd);
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Contains(link) && Catch::Contains("symbolic link"));
  // A link of ours on the way is followed.
  CHECK(OpenPrivateDir(link + "/sub", true, "agent.run_dir", &fd).ok());

  // Group-writable: refused, naming the mode.
  const std::string shared = t.path + "/shared";
  REQUIRE(::mkdir(shared.c_str(), 0700) == 0);
  ::chmod(shared.c_str(), 0770);
  s = OpenPrivateDir(shared, true, "agent.run_dir", &fd);
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Contains(shared) && Catch::Contains("0770") && Catch::Contains("group or others"));
  // ... also as a component on the way (not sticky and root's like /tmp).
  s = OpenPrivateDir(shared + "/run", true, "agent.run_dir", &fd);
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Contains(shared) && Catch::Contains("component"));
  CHECK_FALSE(Exists(shared + "/run"));

  if (::geteuid() == 0) {
    const std::string foreign = t.path + "/foreign";
    REQUIRE(::mkdir(foreign.c_str(), 0700) == 0);
    REQUIRE(::chown(foreign.c_str(), kNobody, kNobody) == 0);
    s = OpenPrivateDir(foreign, true, "agent.run_dir", &fd);
    CHECK(s.code() == Code::kFailedPrecondition);
    CHECK_THAT(s.message(), Catch::Contains(foreign) && Catch::Contains("uid 65534"));
    s = OpenPrivateDir(foreign + "/run", true, "agent.run_dir", &fd);
    CHECK_THAT(s.message(), Catch::Contains(foreign) && Catch::Contains("uid 65534"));
    CHECK_FALSE(Exists(foreign + "/run"));
    // Another user's link on the way (as in sticky /tmp): refused.
    const std::string their_link = t.path + "/their-link";
    REQUIRE(::symlink(made.c_str(), their_link.c_str()) == 0);
    REQUIRE(::lchown(their_link.c_str(), kNobody, kNobody) == 0);
    s = OpenPrivateDir(their_link + "/x", true, "agent.run_dir", &fd);
    CHECK_THAT(s.message(), Catch::Contains(their_link) && Catch::Contains("uid 65534"));
  }
}

TEST_CASE("the agent's instance lock refuses a linked or group-writable run dir", "[security]") {
  TempDir t;
  const std::string target = t.path + "/target";
  REQUIRE(::mkdir(target.c_str(), 0700) == 0);
  const std::string link = t.path + "/run";
  REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
  InstanceLock l;
  Status s = InstanceLock::Claim(link, "job", 0, &l);
  CHECK_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("agent.run_dir '" + link + "'") && Catch::Contains("symbolic link"));
  CHECK_FALSE(Exists(target + "/job.node0.lock"));  // nothing made through the link

  ::chmod(target.c_str(), 0777);
  s = InstanceLock::Claim(target, "job", 0, &l);
  CHECK_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains(target) && Catch::Contains("0777"));
  CHECK_FALSE(Exists(target + "/job.node0.lock"));

  // A lock file planted as a link in our own run dir: refused, target untouched.
  const std::string run = t.path + "/own";
  REQUIRE(::mkdir(run.c_str(), 0700) == 0);
  Write(t.path + "/victim", "keep\n");
  REQUIRE(::symlink((t.path + "/victim").c_str(), (run + "/job.node0.lock").c_str()) == 0);
  s = InstanceLock::Claim(run, "job", 0, &l);
  CHECK_THAT(s.message(), Catch::Contains(run + "/job.node0.lock") && Catch::Contains("symbolic link"));
  CHECK(Slurp(t.path + "/victim") == "keep\n");
}

TEST_CASE("files in the run dir are never written or read through a link or from another user", "[security]") {
  TempDir t;
  UniqueFd dir;
  REQUIRE(OpenPrivateDir(t.path, false, "dir", &dir).ok());
  const std::string victim = t.path + "/victim";
  Write(victim, "keep\n");

  // Replace: a fresh file, then a regular file replaced, mode 0600.
  REQUIRE(ReplaceFileAt(dir.get(), t.path, "status.json", "{}\n").ok());
  REQUIRE(ReplaceFileAt(dir.get(), t.path, "status.json", "{\"a\":1}\n").ok());
  CHECK(Slurp(t.path + "/status.json") == "{\"a\":1}\n");
  struct stat st {};
  REQUIRE(::stat((t.path + "/status.json").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  // A link at the final name: refused, nothing written through it, the link kept.
  REQUIRE(::symlink(victim.c_str(), (t.path + "/runner.json").c_str()) == 0);
  Status s = ReplaceFileAt(dir.get(), t.path, "runner.json", "x\n");
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Contains(t.path + "/runner.json") && Catch::Contains("symbolic link"));
  CHECK(Slurp(victim) == "keep\n");
  s = ReplaceFile(t.path + "/runner.json", "x\n", false);
  CHECK_FALSE(s.ok());
  CHECK(Slurp(victim) == "keep\n");
  // A link at the old temporary name (status.json.tmp) is never used.
  REQUIRE(::symlink(victim.c_str(), (t.path + "/s.json.tmp").c_str()) == 0);
  REQUIRE(ReplaceFile(t.path + "/s.json", "y\n", true).ok());
  CHECK(Slurp(victim) == "keep\n");
  CHECK(Slurp(t.path + "/s.json") == "y\n");

  // Reading: only a regular file of ours that others cannot write.
  std::string text;
  REQUIRE(ReadPrivateFile(t.path + "/s.json", 1024, &text).ok());
  CHECK(text == "y\n");
  s = ReadPrivateFile(t.path + "/runner.json", 1024, &text);
  CHECK_THAT(s.message(), Catch::Contains("symbolic link"));
  ::chmod((t.path + "/s.json").c_str(), 0666);
  s = ReadPrivateFile(t.path + "/s.json", 1024, &text);
  CHECK_THAT(s.message(), Catch::Contains(t.path + "/s.json") && Catch::Contains("0666"));
  ::chmod((t.path + "/s.json").c_str(), 0600);
  if (::geteuid() == 0) {
    REQUIRE(::chown((t.path + "/s.json").c_str(), kNobody, kNobody) == 0);
    s = ReadPrivateFile(t.path + "/s.json", 1024, &text);
    CHECK_THAT(s.message(), Catch::Contains(t.path + "/s.json") && Catch::Contains("uid 65534"));
  }
  CHECK_FALSE(ReadPrivateFile(t.path + "/s.json", 1, &text).ok());  // too large
}

TEST_CASE("pid files in /tmp are created new, never through a link", "[security]") {
  TempDir t;
  const std::string victim = t.path + "/victim";
  Write(victim, "keep\n");
  const std::string pidfile = t.path + "/123.deepspeed";
  REQUIRE(::symlink(victim.c_str(), pidfile.c_str()) == 0);
  Status s = CreateNewFile(pidfile, "42\n");
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Contains(pidfile) && Catch::Contains("symbolic link"));
  CHECK(Slurp(victim) == "keep\n");
  ::unlink(pidfile.c_str());
  REQUIRE(CreateNewFile(pidfile, "42\n").ok());
  REQUIRE(CreateNewFile(pidfile, "43\n").ok());  // our own earlier file: replaced
  CHECK(Slurp(pidfile) == "43\n");
  struct stat st {};
  REQUIRE(::stat(pidfile.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  if (::geteuid() == 0) {
    REQUIRE(::chown(pidfile.c_str(), kNobody, kNobody) == 0);
    s = CreateNewFile(pidfile, "44\n");
    CHECK_THAT(s.message(), Catch::Contains(pidfile) && Catch::Contains("uid 65534"));
  }
}

TEST_CASE("a pid is the recorded process only while its start time matches", "[security]") {
  const uint64_t mine = ProcessStartTime(::getpid());
  CHECK(mine > 0);
  CHECK(SameProcess(::getpid(), mine));
  CHECK_FALSE(SameProcess(::getpid(), mine + 1));
  CHECK_FALSE(SameProcess(::getpid(), 0));
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  // A zombie (exited, not yet reaped) is not alive; a reaped pid is nothing.
  for (int i = 0; i < 500 && ProcessStartTime(child) != 0; ++i) ::usleep(10000);
  CHECK(ProcessStartTime(child) == 0);
  ::waitpid(child, nullptr, 0);
  CHECK(ProcessStartTime(child) == 0);
}
