#include <cstdlib>
#include <map>

#include "launcher/agent/options.h"
#include "launcher/agent/rank_env.h"
#include "launcher/common/job_id.h"
#include "tests/catch.h"

using namespace ftrun;

namespace {

Status Parse(std::vector<std::string> args, AgentOptions* o) {
  args.insert(args.begin(), "ftrun-agent");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  bool help = false;
  return ParseAgentOptions(static_cast<int>(argv.size()), argv.data(), o, &help);
}

std::map<std::string, std::string> EnvMap(const std::vector<std::string>& env) {
  std::map<std::string, std::string> m;
  for (const auto& kv : env) m[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  return m;
}

}  // namespace

TEST_CASE("DeepSpeed's --world_info decodes in hostfile order", "[agent]") {
  // base64url of {"worker-1": [0, 1], "worker-0": [2, 3, 5]}
  std::vector<std::pair<std::string, std::vector<int>>> w;
  REQUIRE(DecodeWorldInfo("eyJ3b3JrZXItMSI6IFswLCAxXSwgIndvcmtlci0wIjogWzIsIDMsIDVdfQ==", &w).ok());
  REQUIRE(w.size() == 2);
  CHECK(w[0].first == "worker-1");
  CHECK(w[1].second == std::vector<int>{2, 3, 5});
  CHECK_THAT(DecodeWorldInfo("e30=", &w).message(), Catch::Contains("expected base64 of a JSON object"));
  CHECK_THAT(DecodeWorldInfo("a$b", &w).message(), Catch::Contains("bad character '$'"));
}

TEST_CASE("the launch argv of deepspeed.launcher.launch is accepted", "[agent]") {
  AgentOptions o;
  REQUIRE(Parse({"--world_info=eyJ3b3JrZXItMSI6IFswLCAxXSwgIndvcmtlci0wIjogWzIsIDMsIDVdfQ==", "--node_rank=1",
                 "--master_addr=10.0.0.1", "--master_port=29600", "--job-id", "j1", "--run-dir", "/tmp/x", "train.py",
                 "--lr", "3"},
                &o)
              .ok());
  CHECK(o.num_nodes == 2);
  CHECK(o.local_ranks == 3);
  CHECK(o.first_global_rank == 2);
  CHECK(o.world_size == 5);
  CHECK(o.command == std::vector<std::string>{"train.py", "--lr", "3"});
  CHECK(BuildRankCommand(o, 2) == std::vector<std::string>{"python3", "-u", "train.py", "--local_rank=2", "--lr", "3"});
  auto env = EnvMap(BuildRankEnv(o, RankIdentity{2, 4, 3, "/tmp/x/s.sock"}));
  CHECK(env["RANK"] == "4");
  CHECK(env["LOCAL_RANK"] == "2");
  CHECK(env["CROSS_RANK"] == "1");
  CHECK(env["CUDA_VISIBLE_DEVICES"] == "2,3,5");
  CHECK(env["MASTER_ADDR"] == "10.0.0.1");
  CHECK(env["MASTER_PORT"] == "29603");  // fresh port per restart generation
  CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "3");
  CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "False");  // rank 0 hosts it
  CHECK(env["FTRUN_AGENT_SOCKET"] == "/tmp/x/s.sock");

  // The runner hosts the store: every generation meets there, under its own key prefix.
  o.rendezvous_store = "10.0.0.7:41234";
  env = EnvMap(BuildRankEnv(o, RankIdentity{2, 4, 3, "/tmp/x/s.sock"}));
  CHECK(env["MASTER_ADDR"] == "10.0.0.7");
  CHECK(env["MASTER_PORT"] == "41234");
  CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "True");
  CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "3");
}

TEST_CASE("ranks get OMP_NUM_THREADS=1 as under torchrun, unless the agent's environment sets it", "[agent]") {
  const char* before = std::getenv("OMP_NUM_THREADS");
  const std::string saved = before ? before : "";
  ::unsetenv("OMP_NUM_THREADS");
  AgentOptions o;
  REQUIRE(Parse({"--nproc", "2", "train.py"}, &o).ok());
  CHECK(EnvMap(BuildRankEnv(o, RankIdentity{1, 1, 0, "/tmp/x/s.sock"}))["OMP_NUM_THREADS"] == "1");
  CHECK(EnvMap(BuildStandbyEnv(o, "/tmp/x/s.sock"))["OMP_NUM_THREADS"] == "1");
  CHECK_THAT(ThreadsNotice(o), Catch::Contains("2 ranks on this node"));
  ::setenv("OMP_NUM_THREADS", "4", 1);  // the user's choice wins
  CHECK(EnvMap(BuildRankEnv(o, RankIdentity{1, 1, 0, "/tmp/x/s.sock"}))["OMP_NUM_THREADS"] == "4");
  CHECK(ThreadsNotice(o).empty());
  ::unsetenv("OMP_NUM_THREADS");
  REQUIRE(Parse({"--nproc", "1", "train.py"}, &o).ok());  // one rank: the whole node is its own
  CHECK(EnvMap(BuildRankEnv(o, RankIdentity{0, 0, 0, "/tmp/x/s.sock"})).count("OMP_NUM_THREADS") == 0);
  if (before) ::setenv("OMP_NUM_THREADS", saved.c_str(), 1);
}

TEST_CASE("the rank command follows --module and --no_python and --no_local_rank", "[agent]") {
  AgentOptions o;
  REQUIRE(Parse({"--nproc", "2", "--module", "--no_local_rank", "pkg.train"}, &o).ok());
  CHECK(BuildRankCommand(o, 0) == std::vector<std::string>{"python3", "-u", "-m", "pkg.train"});
  REQUIRE(Parse({"--nproc", "2", "--no_python", "--", "./trainer", "--steps", "3"}, &o).ok());
  CHECK(BuildRankCommand(o, 1) == std::vector<std::string>{"./trainer", "--local_rank=1", "--steps", "3"});
}

TEST_CASE("bad agent command lines are refused with the reason", "[agent]") {
  AgentOptions o;
  CHECK_THAT(Parse({"--nproc", "2"}, &o).message(), Catch::Contains("no training command"));
  CHECK_THAT(Parse({"--nproc", "3", "--world_info", "eyJhIjogWzAsIDFdfQ==", "t.py"}, &o).message(),
             Catch::Contains("--nproc 3 disagrees with --world_info"));
  CHECK_THAT(Parse({"--job-id", "a b", "t.py"}, &o).message(), Catch::Contains("job id 'a b'"));
  CHECK_THAT(Parse({"--config", "/nonexistent.yaml", "t.py"}, &o).message(), Catch::Contains("/nonexistent.yaml"));
}

TEST_CASE("a job id is checked by one rule, the runner's and the agents'", "[agent]") {
  CHECK(CheckJobId("job-1a2b3c4d").ok());
  CHECK(CheckJobId("slurm-42_a.b").ok());
  CHECK(CheckJobId(NewJobId()).ok());
  CHECK(NewJobId() != NewJobId());
  CHECK_THAT(CheckJobId("").message(), Catch::Contains("job id is empty"));
  CHECK_THAT(CheckJobId("../x", "job.id").message(), Catch::Contains("job.id '../x': use letters"));
  CHECK_THAT(CheckJobId(std::string(64, 'a')).message(), Catch::Contains("longer than 63"));
  CHECK(CheckJobId(std::string(63, 'a')).ok());
}
