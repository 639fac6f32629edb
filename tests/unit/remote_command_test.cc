#include "launcher/runner/remote_command.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "launcher/runner/runner_options.h"
#include "tests/catch.h"
#include "tests/unit/temp_dir.h"

using namespace ftrun;

namespace {

using Argv = std::vector<std::string>;

AgentLaunch Launch(const std::string& launcher) {
  AgentLaunch l;
  l.launcher = launcher;
  l.host = "node7";
  l.cwd = "/home/me/my job";
  l.env = {"NCCL_DEBUG=INFO", "FTRUN_JOB_ID=j1"};
  l.agent_argv = {"/opt/ftrun/ftrun-agent", "--agent-id", "3", "--", "python", "train.py", "--msg", "it's"};
  return l;
}

Argv Build(const AgentLaunch& l) {
  Argv argv;
  REQUIRE(BuildLaunchArgv(l, &argv).ok());
  return argv;
}

// The remote shell's view of an ssh/pdsh command line.
Argv RemoteWords(const std::string& cmd) {
  Argv words;
  REQUIRE(ShellSplit(cmd, &words).ok());
  return words;
}

const Argv kExpectedRemote = {"cd",
                              "/home/me/my job",
                              "&&",
                              "exec",
                              "env",
                              "NCCL_DEBUG=INFO",
                              "FTRUN_JOB_ID=j1",
                              "/opt/ftrun/ftrun-agent",
                              "--agent-id",
                              "3",
                              "--",
                              "python",
                              "train.py",
                              "--msg",
                              "it's"};

}  // namespace

TEST_CASE("local: the agent's own argv") { CHECK(Build(Launch("local")) == Launch("local").agent_argv); }

TEST_CASE("ssh: batch mode, port and launcher args before the host, one quoted remote command") {
  AgentLaunch l = Launch("ssh");
  l.ssh_port = 2222;
  l.launcher_args = {"-i", "/keys/id"};
  Argv argv = Build(l);
  REQUIRE(argv.size() == 9);
  CHECK(Argv(argv.begin(), argv.begin() + 8) ==
        Argv{"ssh", "-o", "BatchMode=yes", "-p", "2222", "-i", "/keys/id", "node7"});
  CHECK(RemoteWords(argv[8]) == kExpectedRemote);
}

TEST_CASE("pdsh: one host, exit status of the remote command, same remote command as ssh") {
  Argv argv = Build(Launch("pdsh"));
  REQUIRE(argv.size() == 7);
  CHECK(Argv(argv.begin(), argv.begin() + 6) == Argv{"pdsh", "-S", "-R", "ssh", "-w", "node7"});
  CHECK(RemoteWords(argv[6]) == kExpectedRemote);
}

TEST_CASE("openmpi: one process per mpirun, unbound, root allowed only as root") {
  AgentLaunch l = Launch("openmpi");
  Argv argv = Build(l);
  Argv head = {"mpirun", "-n", "1", "--host", "node7", "--bind-to", "none", "--wdir", "/home/me/my job", "env"};
  CHECK(Argv(argv.begin(), argv.begin() + 10) == head);
  CHECK(std::find(argv.begin(), argv.end(), "--allow-run-as-root") == argv.end());
  CHECK(Argv(argv.end() - 8, argv.end()) == l.agent_argv);
  l.as_root = true;
  argv = Build(l);
  CHECK(argv[9] == "--allow-run-as-root");
}

TEST_CASE("mpich and impi: hydra flags; mvapich: mpirun_rsh with VAR=VAL before the program") {
  for (const char* name : {"mpich", "impi"}) {
    Argv argv = Build(Launch(name));
    CHECK(Argv(argv.begin(), argv.begin() + 8) ==
          Argv{"mpirun", "-n", "1", "-hosts", "node7", "-wdir", "/home/me/my job", "env"});
  }
  Argv argv = Build(Launch("mvapich"));
  CHECK(Argv(argv.begin(), argv.begin() + 6) ==
        Argv{"mpirun_rsh", "-np", "1", "node7", "NCCL_DEBUG=INFO", "FTRUN_JOB_ID=j1"});
}

TEST_CASE("slurm: a one-task step on the node, not killed with the others, launcher args before the command") {
  AgentLaunch l = Launch("slurm");
  l.launcher_args = {"--cpus-per-task=32"};
  Argv argv = Build(l);
  Argv head = {"srun",
               "--nodes=1",
               "--ntasks=1",
               "--nodelist=node7",
               "--kill-on-bad-exit=0",
               "--cpu-bind=none",
               "--chdir=/home/me/my job",
               "--cpus-per-task=32",
               "env",
               "NCCL_DEBUG=INFO",
               "FTRUN_JOB_ID=j1"};
  CHECK(Argv(argv.begin(), argv.begin() + 11) == head);
  CHECK(Argv(argv.begin() + 11, argv.end()) == l.agent_argv);
}

TEST_CASE("bad launches are refused with the reason") {
  AgentLaunch l = Launch("ssh");
  l.host.clear();
  Argv argv;
  Status s = BuildLaunchArgv(l, &argv);
  CHECK_FALSE(s.ok());
  CHECK(s.message().find("--launcher ssh needs a host name") != std::string::npos);
  l = Launch("carrier-pigeon");
  s = BuildLaunchArgv(l, &argv);
  CHECK(s.message().find("--launcher carrier-pigeon") != std::string::npos);
  l = Launch("slurm");
  l.agent_argv.clear();
  CHECK_FALSE(BuildLaunchArgv(l, &argv).ok());
}

TEST_CASE("ShellQuote round-trips through a shell split") {
  for (std::string w : {"plain", "with space", "it's", "", "$HOME", "a\"b", "semi;colon", "new\nline"}) {
    Argv words;
    REQUIRE(ShellSplit(ShellQuote(w), &words).ok());
    REQUIRE(words.size() == 1);
    CHECK(words[0] == w);
  }
  CHECK(ShellQuote("--flag=a/b.c") == "--flag=a/b.c");
}

TEST_CASE("ForwardedEnv: DeepSpeed's prefixes, then .deepspeed_env lines, later files win") {
  TempDir dir;
  std::ofstream(dir.path() + "/a") << "# comment\nFOO=1\nNCCL_DEBUG=WARN\n\nnot a var\n";
  std::ofstream(dir.path() + "/b") << "FOO=2\n";
  std::vector<std::string> vars = {"NCCL_DEBUG=INFO", "PYTHONPATH=/x", "UCX_TLS=tcp", "MV2_X=1",
                                   "FTRUN_LOG=1",     "HOME=/root",    "SECRET=no",   "NOEQUALS"};
  std::vector<char*> env;
  for (auto& v : vars) env.push_back(v.data());
  env.push_back(nullptr);
  auto out = ForwardedEnv(env.data(), {dir.path() + "/a", dir.path() + "/missing", dir.path() + "/b"});
  CHECK(out ==
        std::vector<std::string>{"FOO=2", "FTRUN_LOG=1", "MV2_X=1", "NCCL_DEBUG=WARN", "PYTHONPATH=/x", "UCX_TLS=tcp"});
}
