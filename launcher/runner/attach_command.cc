// `ftrun --attach JOB`: take over a running job whose runner died, from its runner.json (see runner.h).
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "launcher/common/supervisor.h"
#include "launcher/runner/hostfile.h"
#include "launcher/runner/remote_command.h"
#include "launcher/runner/runner.h"
#include "plugin/common/fd.h"
#include "plugin/common/log.h"
#include "plugin/common/proc_start.h"
#include "plugin/common/safe_dir.h"
#include "plugin/config/config.h"
#include "plugin/persist/persist_reader.h"
#include "plugin/transport/secret.h"
#include "plugin/transport/ucx_transport.h"
#include "recovery/coordinator.h"

extern char** environ;

namespace ftrun {

int AttachJob(int argc, char** argv) {
  CLI::App app{"ftrun --attach JOB: take over a running job whose runner died"};
  app.name("ftrun");
  std::string job, config_path;
  app.add_option("--attach", job, "the job id (see `ftrun status`)")->required();
  app.add_option("--config", config_path, "the ftrun YAML config the job was started with (for agent.run_dir)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  Config config = DefaultConfig();
  if (!config_path.empty()) {
    Status s = LoadConfigFile(config_path, &config);
    if (!s.ok()) return std::fprintf(stderr, "ftrun --attach: %s\n", s.message().c_str()), 2;
  }
  const std::string path = config.agent.run_dir + "/" + job + "/runner.json";
  // Only what this user wrote: the directory and the file checked (safe_dir.h).
  std::string text;
  Status read = ReadPrivateFile(path, 1u << 20, &text);
  if (!read.ok()) {
    const bool refused = read.code() == Code::kFailedPrecondition;  // there, but not trusted
    std::fprintf(stderr, "ftrun --attach: cannot read %s: %s%s\n", path.c_str(), read.message().c_str(),
                 refused ? "" : " (is agent.run_dir right? pass the job's --config)");
    return 2;
  }
  RunnerOptions options;
  Status s = ParseSavedCommandLine(text, path, &options);
  if (s.ok()) s = EnterSavedDirectory(options);
  if (!s.ok()) {
    std::fprintf(stderr, "ftrun --attach: %s (is agent.run_dir right? pass the job's --config)\n", s.message().c_str());
    return 2;
  }
  options.attach_job = job;
  InitLogging("ftrun", -1, -1, options.quiet ? "warn" : options.log_level);
  FTRUN_LOG_WARN("attaching to job {} (its first command line: ftrun {})", job,
                 nlohmann::json::parse(text)["argv"].dump());
  return RunJob(options);
}

}  // namespace ftrun
