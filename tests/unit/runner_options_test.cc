#include "launcher/runner/runner_options.h"

#include <ftw.h>
#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "launcher/runner/remote_command.h"
#include "tests/catch.h"
#include "tests/unit/temp_dir.h"

using namespace ftrun;

namespace {

using Args = std::vector<std::string>;

Status Parse(Args args, RunnerOptions* o, bool* help = nullptr) {
  args.insert(args.begin(), "ftrun");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  bool h = false;
  Status s = ParseRunnerOptions(static_cast<int>(argv.size()), argv.data(), o, &h);
  if (help != nullptr) *help = h;
  return s;
}

RunnerOptions Ok(const Args& args) {
  RunnerOptions o;
  Status s = Parse(args, &o);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return o;
}

// The message of a refused command line; checks the code, that it is not
// help, and that *out was left alone.
std::string Err(const Args& args) {
  RunnerOptions o;
  o.command = {"untouched"};
  bool help = true;
  Status s = Parse(args, &o, &help);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK_FALSE(help);
  CHECK(o.command == Args{"untouched"});
  return s.message();
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> w;
  Status st = ShellSplit(s, &w);
  INFO(st.ToString());
  REQUIRE(st.ok());
  return w;
}

std::string SplitError(const std::string& s) {
  std::vector<std::string> w{"untouched"};
  Status st = ShellSplit(s, &w);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(w == Args{"untouched"});
  return st.message();
}

}  // namespace

TEST_CASE("runner: defaults match deepspeed's", "[runner][options]") {
  RunnerOptions o = Ok({"train.py"});
  CHECK(o.hostfile == "/job/hostfile");
  CHECK_FALSE(o.hostfile_given);
  CHECK(o.include.empty());
  CHECK(o.exclude.empty());
  CHECK(o.num_nodes == -1);
  CHECK(o.num_gpus == -1);
  CHECK(o.master_addr.empty());
  CHECK(o.master_port == 29500);
  CHECK(o.node_rank == -1);
  CHECK(o.launcher == "local");
  CHECK(o.launcher_args.empty());
  CHECK_FALSE(o.module);
  CHECK_FALSE(o.no_python);
  CHECK_FALSE(o.no_local_rank);
  CHECK_FALSE(o.no_ssh);
  CHECK_FALSE(o.force_multi);
  CHECK_FALSE(o.save_pid);
  CHECK(o.enable_each_rank_log.empty());
  CHECK_FALSE(o.bind_cores_to_rank);
  CHECK(o.bind_core_list.empty());
  CHECK(o.ssh_port == -1);
  CHECK(o.log_level == "info");
  CHECK_FALSE(o.quiet);
  CHECK(o.config.empty());
  CHECK(o.spares == -1);
  CHECK(o.status_file.empty());
  CHECK(o.agent_exec_prefix.empty());
  CHECK(o.agent_addr == "127.0.0.1");
  CHECK(o.coordinator_addr == "127.0.0.1");
  CHECK(o.command == Args{"train.py"});
}

TEST_CASE("runner: every deepspeed flag, in both value forms", "[runner][options]") {
  RunnerOptions o = Ok({"-H",
                        "/etc/hosts.txt",
                        "--num_nodes=2",
                        "--num_gpus",
                        "4",
                        "--master_addr",
                        "10.0.0.1",
                        "--master_port=29600",
                        "--node_rank",
                        "1",
                        "--launcher",
                        "OpenMPI",
                        "--launcher_args",
                        "-x FOO --mca btl ^openib",
                        "--module",
                        "--no_local_rank",
                        "--no_ssh",
                        "--no_ssh_check",
                        "--force_multi",
                        "--save_pid",
                        "--enable_each_rank_log",
                        "/logs",
                        "--bind_cores_to_rank",
                        "--bind_core_list=0-15,32,40-47",
                        "--ssh_port",
                        "2222",
                        "--log_level",
                        "WARNING",
                        "-q",
                        "pkg.train",
                        "--lr",
                        "3"});
  CHECK(o.hostfile == "/etc/hosts.txt");
  CHECK(o.hostfile_given);
  CHECK(o.num_nodes == 2);
  CHECK(o.num_gpus == 4);
  CHECK(o.master_addr == "10.0.0.1");
  CHECK(o.master_port == 29600);
  CHECK(o.node_rank == 1);
  CHECK(o.launcher == "openmpi");  // lower-cased, as deepspeed does
  CHECK(o.launcher_args == "-x FOO --mca btl ^openib");
  CHECK(o.module);
  CHECK(o.no_local_rank);
  CHECK(o.no_ssh);
  CHECK(o.no_ssh_check);
  CHECK(o.force_multi);
  CHECK(o.save_pid);
  CHECK(o.enable_each_rank_log == "/logs");
  CHECK(o.bind_cores_to_rank);
  CHECK(o.bind_core_list == "0-15,32,40-47");
  CHECK(o.ssh_port == 2222);
  CHECK(o.log_level == "warn");
  CHECK(o.quiet);
  CHECK(o.command == Args{"pkg.train", "--lr", "3"});

  o = Ok({"--hostfile=h", "--include", "a@b:0,1", "--no_python", "--quiet", "./bin"});
  CHECK(o.hostfile == "h");
  CHECK(o.hostfile_given);
  CHECK(o.include == "a@b:0,1");
  CHECK(Ok({"--num_accelerators=2", "t.py"}).num_gpus == 2);
  CHECK(Ok({"--num_gpus", "+3", "t.py"}).num_gpus == 3);
  CHECK(Ok({"--num_gpus", "010", "t.py"}).num_gpus == 10);  // decimal, as Python's int()
  CHECK(o.no_python);
  CHECK(o.quiet);
  CHECK(o.command == Args{"./bin"});

  o = Ok({"-Hh2", "-e=a:1", "t.py"});
  CHECK(o.hostfile == "h2");
  CHECK(o.exclude == "a:1");
  o = Ok({"-i", "a", "--launcher=SLURM", "t.py"});
  CHECK(o.include == "a");
  CHECK(o.launcher == "slurm");
  for (const char* l : {"pdsh", "openmpi", "mvapich", "slurm", "mpich", "impi", "local", "ssh"}) {
    CHECK(Ok({"--launcher", l, "t.py"}).launcher == l);
  }
  for (const char* l : {"trace", "debug", "info", "warn", "error", "Info"}) {
    CHECK_FALSE(Ok({"--log_level", l, "t.py"}).log_level.empty());
  }
}

TEST_CASE("runner: ftrun's own flags", "[runner][options]") {
  RunnerOptions o =
      Ok({"--config", "ftrun.yaml", "--spares", "2", "--status_file", "/tmp/s.json", "--agent_exec_prefix",
          "ip netns exec ns{node}", "--agent_addr", "10.99.{node}.2", "--coordinator_addr=10.99.0.1", "t.py"});
  CHECK(o.config == "ftrun.yaml");
  CHECK(o.spares == 2);
  CHECK(o.status_file == "/tmp/s.json");
  CHECK(o.agent_exec_prefix == "ip netns exec ns{node}");
  CHECK(o.agent_addr == "10.99.{node}.2");
  CHECK(o.coordinator_addr == "10.99.0.1");
  CHECK(Ok({"--spares", "0", "t.py"}).spares == 0);
}

TEST_CASE("runner: everything from the script on is untouched", "[runner][options]") {
  RunnerOptions o = Ok({"--num_gpus", "2", "train.py", "--num_gpus", "8", "--help", "-H", "x", "--", "--bogus"});
  CHECK(o.num_gpus == 2);
  CHECK_FALSE(o.hostfile_given);
  CHECK(o.command == Args{"train.py", "--num_gpus", "8", "--help", "-H", "x", "--", "--bogus"});

  o = Ok({"--module", "--", "-weird-script-name", "--x"});
  CHECK(o.command == Args{"-weird-script-name", "--x"});
  o = Ok({"-", "arg"});  // "-" is a script (python reads stdin)
  CHECK(o.command == Args{"-", "arg"});
  o = Ok({"t.py", ""});
  CHECK(o.command == Args{"t.py", ""});
}

TEST_CASE("runner: values may start with '-', be empty, and repeat", "[runner][options]") {
  RunnerOptions o = Ok({"--launcher_args", "-N 4", "--node_rank", "-1", "t.py"});
  CHECK(o.launcher_args == "-N 4");
  CHECK(o.node_rank == -1);
  CHECK(Ok({"--launcher_args", "--exclusive", "t.py"}).launcher_args == "--exclusive");
  CHECK(Ok({"--launcher_args=--mca=x", "t.py"}).launcher_args == "--mca=x");
  CHECK(Ok({"-i", "-", "t.py"}).include == "-");  // fails later, in SelectNodes, as an unknown host

  o = Ok({"--include", "", "--master_addr=", "--enable_each_rank_log", "None", "t.py"});
  CHECK(o.include.empty());
  CHECK(o.master_addr.empty());
  CHECK(o.enable_each_rank_log.empty());  // deepspeed's "None" means off

  o = Ok({"--master_port", "1", "--master_port", "2", "--module", "--module", "t.py"});
  CHECK(o.master_port == 2);
  CHECK(o.module);
}

TEST_CASE("runner: long flags may be shortened to a unique prefix, as argparse allows", "[runner][options]") {
  RunnerOptions o = Ok({"--num_node", "2", "--master_p=1234", "--num_acc", "3", "--no_py", "t.py"});
  CHECK(o.num_nodes == 2);
  CHECK(o.master_port == 1234);
  CHECK(o.num_gpus == 3);
  CHECK(o.no_python);
  CHECK(Ok({"--no_ssh", "t.py"}).no_ssh);  // exact beats prefix (--no_ssh_check)
  CHECK_FALSE(Ok({"--no_ssh", "t.py"}).no_ssh_check);

  CHECK(Err({"--num", "2", "t.py"}) ==
        "ftrun: ambiguous flag '--num': could be --num_accelerators, --num_gpus, --num_nodes\n"
        "Run 'ftrun --help' for usage.");
  CHECK_THAT(Err({"--no_s", "t.py"}), Catch::StartsWith("ftrun: ambiguous flag '--no_s': could be --no_ssh, "
                                                        "--no_ssh_check"));
}

TEST_CASE("runner: --help and -h return the help text", "[runner][options]") {
  for (const char* flag : {"--help", "-h", "--he"}) {
    RunnerOptions o;
    bool help = false;
    Status s = Parse({"--num_gpus", "2", flag, "t.py"}, &o, &help);
    CHECK(help);
    CHECK(s.code() == Code::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("Usage: ftrun [options] SCRIPT [ARGS...]"));
    CHECK_THAT(s.message(), Catch::Contains("--hostfile"));
    CHECK_THAT(s.message(), Catch::Contains("--num_accelerators"));
    CHECK_THAT(s.message(), Catch::Contains("--agent_exec_prefix"));
  }
  bool help = false;
  RunnerOptions o;
  CHECK(Parse({"--help"}, &o, &help).code() == Code::kInvalidArgument);  // no script needed for help
  CHECK(help);
}

TEST_CASE("runner: bad command lines name the flag and what was expected", "[runner][options]") {
  const std::string tail = "\nRun 'ftrun --help' for usage.";
  CHECK(Err({}) == "ftrun: no training script given; expected ftrun [options] SCRIPT [ARGS...]" + tail);
  CHECK(Err({"--num_gpus", "2"}) ==
        "ftrun: no training script given; expected ftrun [options] SCRIPT [ARGS...]" + tail);
  CHECK(Err({"--module", "--"}) == "ftrun: no training script given; expected ftrun [options] SCRIPT [ARGS...]" + tail);
  CHECK(Err({"--bogus", "t.py"}) == "ftrun: unknown flag '--bogus'" + tail);
  CHECK(Err({"--bogus=1", "t.py"}) == "ftrun: unknown flag '--bogus'" + tail);
  CHECK(Err({"--autotuning", "run", "t.py"}) == "ftrun: unknown flag '--autotuning'" + tail);
  CHECK(Err({"-x", "t.py"}) == "ftrun: unknown flag '-x'" + tail);
  CHECK(Err({"--=3", "t.py"}) == "ftrun: unknown flag '--=3'" + tail);
  CHECK(Err({"--master_port"}) == "ftrun: --master_port: expected a value after it" + tail);
  CHECK(Err({"-H"}) == "ftrun: --hostfile: expected a value after it" + tail);
  CHECK(Err({"--module=1", "t.py"}) == "ftrun: --module takes no value, got '--module=1'" + tail);
  CHECK(Err({"-qx", "t.py"}) == "ftrun: -q takes no value, got '-qx'" + tail);
  CHECK(Err({"--master_port", "abc", "t.py"}) == "ftrun: --master_port: expected an integer, got 'abc'" + tail);
  CHECK(Err({"--num_nodes=two", "t.py"}) == "ftrun: --num_nodes: expected an integer, got 'two'" + tail);
  CHECK(Err({"--num_acc", "2.5", "t.py"}) == "ftrun: --num_gpus: expected an integer, got '2.5'" + tail);
  CHECK(Err({"--spares", "", "t.py"}) == "ftrun: --spares: expected an integer, got ''" + tail);
  CHECK(Err({"--node_rank", "0x1", "t.py"}) == "ftrun: --node_rank: expected an integer, got '0x1'" + tail);
  CHECK(Err({"--ssh_port", "99999999999", "t.py"}) ==
        "ftrun: --ssh_port: expected an integer, got '99999999999'" + tail);
  CHECK(Err({"--master_port", "-", "t.py"}) == "ftrun: --master_port: expected an integer, got '-'" + tail);
}

TEST_CASE("runner: out-of-range values and bad choices are refused", "[runner][options]") {
  const std::string tail = "\nRun 'ftrun --help' for usage.";
  CHECK(Err({"--launcher", "mpirun", "t.py"}) ==
        "ftrun: --launcher: expected one of pdsh|openmpi|mvapich|slurm|mpich|impi|local|ssh, got 'mpirun'" + tail);
  CHECK(Err({"--log_level", "loud", "t.py"}) ==
        "ftrun: --log_level: expected one of trace|debug|info|warn|error, got 'loud'" + tail);
  CHECK(Err({"-H", "", "t.py"}) == "ftrun: --hostfile: expected a file path, got ''" + tail);
  CHECK(Err({"--num_nodes", "0", "t.py"}) == "ftrun: --num_nodes: expected a number of nodes >= 1, got 0" + tail);
  CHECK(Err({"--num_nodes", "-5", "t.py"}) == "ftrun: --num_nodes: expected a number of nodes >= 1, got -5" + tail);
  CHECK(Err({"--num_gpus", "0", "t.py"}) ==
        "ftrun: --num_gpus: expected a number of slots per node >= 1, got 0" + tail);
  CHECK(Err({"--num_accelerators", "-2", "t.py"}) ==
        "ftrun: --num_gpus: expected a number of slots per node >= 1, got -2" + tail);
  CHECK(Err({"--master_port", "0", "t.py"}) == "ftrun: --master_port: expected a port from 1 to 65535, got 0" + tail);
  CHECK(Err({"--master_port", "65536", "t.py"}) ==
        "ftrun: --master_port: expected a port from 1 to 65535, got 65536" + tail);
  CHECK(Err({"--node_rank", "-2", "t.py"}) == "ftrun: --node_rank: expected a node index >= 0, got -2" + tail);
  CHECK(Err({"--ssh_port", "0", "t.py"}) == "ftrun: --ssh_port: expected a port from 1 to 65535, got 0" + tail);
  CHECK(Err({"--spares", "-3", "t.py"}) == "ftrun: --spares: expected a number of spare nodes >= 0, got -3" + tail);
  CHECK(Err({"--bind_core_list", "3-1", "t.py"}) ==
        "ftrun: --bind_core_list: expected core ids like '0-15,32,40-47', got '3-1'" + tail);
  CHECK(Err({"--bind_core_list", "0,,1", "t.py"}) ==
        "ftrun: --bind_core_list: expected core ids like '0-15,32,40-47', got '0,,1'" + tail);
  CHECK(Err({"--bind_core_list", "a-b", "t.py"}) ==
        "ftrun: --bind_core_list: expected core ids like '0-15,32,40-47', got 'a-b'" + tail);
  CHECK(Err({"--agent_addr", "", "t.py"}) == "ftrun: --agent_addr: expected an address template, got ''" + tail);
  CHECK(Err({"--coordinator_addr=", "t.py"}) == "ftrun: --coordinator_addr: expected an address, got ''" + tail);
}

TEST_CASE("runner: conflicting flags are refused, naming both", "[runner][options]") {
  const std::string tail = "\nRun 'ftrun --help' for usage.";
  CHECK(Err({"-i", "a", "-e", "b", "t.py"}) == "ftrun: --include and --exclude are mutually exclusive" + tail);
  CHECK(Err({"--include", "a", "--num_nodes", "1", "t.py"}) ==
        "ftrun: --include cannot be combined with --num_nodes; pick hosts and slots with one or the other" + tail);
  CHECK(Err({"--include", "a", "--num_gpus", "1", "t.py"}) ==
        "ftrun: --include cannot be combined with --num_gpus; pick hosts and slots with one or the other" + tail);
  CHECK(Err({"--exclude", "a", "--num_accelerators", "1", "t.py"}) ==
        "ftrun: --exclude cannot be combined with --num_gpus; pick hosts and slots with one or the other" + tail);
  CHECK(Err({"--module", "--no_python", "t.py"}) == "ftrun: --module and --no_python are mutually exclusive" + tail);
  CHECK(Err({"--no_ssh", "--launcher", "ssh", "t.py"}) ==
        "ftrun: --no_ssh cannot be combined with --launcher ssh" + tail);
  CHECK(Err({"--launcher_args", "-x 'FOO", "t.py"}) ==
        "ftrun: --launcher_args: unterminated single quote at offset 3 in '-x 'FOO'; expected a closing '" + tail);
  CHECK(Err({"--agent_exec_prefix", "ip netns exec \"ns{node}", "t.py"}) ==
        "ftrun: --agent_exec_prefix: unterminated double quote at offset 14 in 'ip netns exec \"ns{node}'; "
        "expected a closing \"" +
            tail);
}

TEST_CASE("ShellSplit: quotes and backslashes as a POSIX shell", "[runner][shell]") {
  CHECK(Split("").empty());
  CHECK(Split("  \t \n").empty());
  CHECK(Split("-x FOO --mca btl ^openib") == Args{"-x", "FOO", "--mca", "btl", "^openib"});
  CHECK(Split("  a\tb\nc  ") == Args{"a", "b", "c"});
  CHECK(Split("'a b' \"c d\" e\\ f") == Args{"a b", "c d", "e f"});
  CHECK(Split("a'b'\"c\"d") == Args{"abcd"});
  CHECK(Split("'' \"\" x") == Args{"", "", "x"});
  CHECK(Split("'$HOME \\n \"'") == Args{"$HOME \\n \""});
  CHECK(Split("\"a\\\"b \\$x \\\\ \\n \\`\"") == Args{"a\"b $x \\ \\n `"});
  CHECK(Split("a\\\nb") == Args{"ab"});
  CHECK(Split("\"a\\\nb\"") == Args{"ab"});
  CHECK(Split("\\'x\\\"") == Args{"'x\""});
  CHECK(Split("ip netns exec ns{node}") == Args{"ip", "netns", "exec", "ns{node}"});
  CHECK(Split("--export=ALL,FOO='a b'") == Args{"--export=ALL,FOO=a b"});
}

TEST_CASE("ShellSplit: unterminated quotes and a lone backslash are errors", "[runner][shell]") {
  CHECK(SplitError("a 'b c") == "unterminated single quote at offset 2 in 'a 'b c'; expected a closing '");
  CHECK(SplitError("\"abc") == "unterminated double quote at offset 0 in '\"abc'; expected a closing \"");
  CHECK(SplitError("\"ab\\\"") == "unterminated double quote at offset 0 in '\"ab\\\"'; expected a closing \"");
  CHECK(SplitError("abc\\") == "expected a character after the backslash at the end of 'abc\\'");
}

TEST_CASE("ExpandNodeTemplate replaces every {node}", "[runner][options]") {
  CHECK(ExpandNodeTemplate("ip netns exec ns{node}", 3) == "ip netns exec ns3");
  CHECK(ExpandNodeTemplate("10.99.{node}.{node}", 12) == "10.99.12.12");
  CHECK(ExpandNodeTemplate("127.0.0.1", 5) == "127.0.0.1");
  CHECK(ExpandNodeTemplate("{nod}{node", 1) == "{nod}{node");
}

TEST_CASE("LoadHosts: a missing default hostfile means one localhost node", "[runner][hostfile]") {
  TempDir dir;
  RunnerOptions o = Ok({"t.py"});
  o.hostfile = dir.path() + "/no/such/hostfile";  // stands in for a missing /job/hostfile
  std::vector<HostEntry> h;
  REQUIRE(LoadHosts(o, &h).ok());
  REQUIRE(h.size() == 1);
  CHECK(h[0].host == "localhost");
  CHECK(h[0].slots == 1);
  CHECK(h[0].rack.empty());

  o.num_gpus = 4;
  REQUIRE(LoadHosts(o, &h).ok());
  CHECK(h[0].slots == 4);

  // A present default hostfile is read.
  o.hostfile = dir.Write("default", "w0 slots=2\nw1 slots=2 rack=r\n");
  REQUIRE(LoadHosts(o, &h).ok());
  REQUIRE(h.size() == 2);
  CHECK(h[1].rack == "r");
}

TEST_CASE("LoadHosts: an explicit --hostfile must exist and parse", "[runner][hostfile]") {
  TempDir dir;
  const std::string missing = dir.path() + "/missing";
  RunnerOptions o = Ok({"--hostfile", missing, "t.py"});
  std::vector<HostEntry> h;
  Status s = LoadHosts(o, &h);
  CHECK(s.code() == Code::kIoError);
  CHECK(s.message() == "--hostfile: cannot open hostfile '" + missing + "': No such file or directory");

  o = Ok({"-H", dir.Write("good", "a slots=8\n"), "t.py"});
  REQUIRE(LoadHosts(o, &h).ok());
  CHECK(h[0].host == "a");
  CHECK(h[0].slots == 8);

  const std::string bad = dir.Write("bad", "a slots=8\na slots=8\n");
  o = Ok({"-H", bad, "t.py"});
  s = LoadHosts(o, &h);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(s.message() == bad + ":2: host 'a' is listed twice (first on line 1); expected each host once");

  // An existing default path that is not readable as a file is an error too.
  o = Ok({"t.py"});
  o.hostfile = dir.path();
  s = LoadHosts(o, &h);
  CHECK(s.code() == Code::kIoError);
  CHECK_THAT(s.message(), Catch::StartsWith("default hostfile: cannot read hostfile '" + dir.path() + "'"));
}

TEST_CASE("ResolveMasterAddr: flag, then 127.0.0.1 for local, then the first host", "[runner][options]") {
  RunnerOptions o = Ok({"t.py"});
  CHECK(ResolveMasterAddr(o, {}) == "127.0.0.1");
  CHECK(ResolveMasterAddr(o, {{"localhost", {0}, ""}}) == "127.0.0.1");
  CHECK(ResolveMasterAddr(o, {{"w1", {0}, ""}, {"w0", {0}, ""}}) == "w1");
  CHECK(ResolveMasterAddr(o, {{"localhost", {0}, ""}, {"w0", {0}, ""}}) == "localhost");
  o.master_addr = "10.0.0.9";
  CHECK(ResolveMasterAddr(o, {{"w1", {0}, ""}}) == "10.0.0.9");
}
