// A job's coordinators one after another (runner.h, leadership.h): the
// runner's, and `ftrun --standby-coordinator JOB`, which waits for its
// job's leader to go, then leads it.
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "launcher/runner/runner.h"
#include "launcher/runner/runner_impl.h"
#include "launcher/runner/signed_state.h"
#include "plugin/common/fd.h"
#include "plugin/common/log.h"
#include "plugin/transport/secret.h"

namespace ftrun {

namespace {

// SIGINT/SIGTERM, read without a handler; children reaped (a runner that
// stepped down still parents the agents it started: their exits must not
// linger as zombies that look alive to the next leader).
class Stopper {
 public:
  Stopper() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, nullptr);
    fd_.Reset(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
  }
  bool operator()() {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    signalfd_siginfo si;
    if (fd_.valid() && ::read(fd_.get(), &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) signal_ = si.ssi_signo;
    return signal_ != 0;
  }
  int signal() const { return signal_; }

 private:
  UniqueFd fd_;
  int signal_ = 0;
};

// The end key's exit code (1 when it cannot be read).
int EndCode(const std::string& job, const std::string& end) {
  nlohmann::json j = nlohmann::json::parse(end, nullptr, false);
  if (j.is_object() && j.contains("exit_code") && j["exit_code"].is_number_integer()) {
    const int code = j["exit_code"].get<int>();
    const std::string why = j.contains("message") && j["message"].is_string() ? j["message"].get<std::string>() : "";
    FTRUN_LOG_INFO("job {} ended under another coordinator: exit {}{}", job, code, why.empty() ? "" : " (" + why + ")");
    return code >= 0 && code <= 255 ? code : 1;
  }
  FTRUN_LOG_ERROR("job {} ended, but its end key is not {{\"exit_code\": N}}: {}", job, end.substr(0, 200));
  return 1;
}

}  // namespace

int RunJob(const RunnerOptions& options) {
  Config config;
  std::string job;
  {
    runner_impl::Runner runner(options);
    const int rc = runner.Run();
    if (!runner.stepped_down()) return rc;
    config = runner.config();
    job = runner.job_id();
  }
  return FollowJob(config, job, options.coordinator_addr);  // and lead it again, if the lease comes back
}

int FollowJob(const Config& config, const std::string& job, const std::string& coordinator_addr) {
  Stopper stop;
  while (true) {
    auto lead = std::make_unique<Leadership>(config.coordinator, job);
    Leadership::Outcome outcome;
    std::string end;
    Status s = lead->Campaign(
        true, [&] { return stop(); }, &outcome, &end);
    if (!s.ok()) return FTRUN_LOG_ERROR("standby coordinator: {}", s.message()), 2;
    if (outcome == Leadership::Outcome::kStopped) return 128 + stop.signal();
    if (outcome == Leadership::Outcome::kEnded) return EndCode(job, end);
    // Nothing etcd holds is believed unless the job secret signed it: read
    // here, from this standby's own agent.run_dir (signed_state.h).
    std::string value, text, secret;
    const std::string where = "etcd key " + lead->keys().state;
    const std::string secret_file = config.agent.run_dir + "/" + job + "/secret";
    s = lead->ReadState(&value);
    if (s.ok()) {
      s = ReadSecretFile(secret_file, &secret);
      if (!s.ok()) s = s.Annotate("the job secret (agent.run_dir of this standby's --config)");
    }
    if (s.ok()) s = VerifyState(secret, secret_file, job, value, where, &text);
    RunnerOptions options;
    if (s.ok()) s = ParseSavedCommandLine(text, where, &options);
    if (s.ok()) s = EnterSavedDirectory(options);
    const nlohmann::json state = s.ok() ? nlohmann::json::parse(text) : nlohmann::json();
    if (s.ok() && (!state.contains("status") || !state["status"].is_object()))
      s = Status::InvalidArgument(where + ": expected a 'status' object next to 'argv'");
    if (!s.ok()) {
      // Leading without what the job needs helps nobody: the lease goes (the
      // destructor leaves it to lapse) and the error says why.
      FTRUN_LOG_ERROR("standby coordinator: cannot take job {} over: {}", job, s.message());
      return 2;
    }
    options.attach_job = job;
    options.attach_state = state["status"].dump();
    if (!coordinator_addr.empty()) options.coordinator_addr = coordinator_addr;
    FTRUN_LOG_WARN("standby coordinator: taking job {} over (term {}; its command line: ftrun {})", job, lead->term(),
                   state["argv"].dump());
    runner_impl::Runner runner(options, std::move(lead));
    const int rc = runner.Run();
    if (!runner.stepped_down()) return rc;
  }
}

int StandbyCoordinator(int argc, char** argv) {
  CLI::App app{"ftrun --standby-coordinator JOB: take over the job when its coordinator's etcd lease lapses"};
  app.name("ftrun");
  std::string job, config_path, addr, log_level = "info";
  app.add_option("--standby-coordinator", job, "the job id")->required();
  app.add_option("--config", config_path, "the job's ftrun YAML config (coordinator.etcd_endpoints, agent.run_dir)")
      ->required();
  app.add_option("--coordinator_addr", addr, "the address to listen on once leading (default: the job's)");
  app.add_option("--log_level", log_level, "trace|debug|info|warn|error");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  Config config = DefaultConfig();
  Status s = LoadConfigFile(config_path, &config);
  if (s.ok() && !UsesEtcd(config.coordinator)) {
    s = Status::InvalidArgument(config_path +
                                ": coordinator.etcd_endpoints: expected etcd URLs (a standby coordinator finds its "
                                "job's leader in etcd), got none");
  }
  if (!s.ok()) return std::fprintf(stderr, "ftrun --standby-coordinator: %s\n", s.message().c_str()), 2;
  InitLogging("ftrun", -1, -1, log_level);
  return FollowJob(config, job, addr);
}

}  // namespace ftrun
