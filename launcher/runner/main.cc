// ftrun: the drop-in for the `deepspeed` command. See launcher/runner/runner.h.
#include <cstdio>
#include <string>

#include "launcher/runner/export_command.h"
#include "launcher/runner/runner.h"
#include "launcher/runner/runner_options.h"
#include "launcher/runner/status_command.h"
#include "plugin/common/log.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "status") return ftrun::RunStatusCommand(argc - 1, argv + 1);
  if (argc > 1 && std::string(argv[1]) == "export") return ftrun::RunExportCommand(argc - 1, argv + 1);
  if (argc > 1 && std::string(argv[1]) == "--attach") return ftrun::AttachJob(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "--standby-coordinator") return ftrun::StandbyCoordinator(argc, argv);
  ftrun::RunnerOptions options;
  bool help = false;
  ftrun::Status s = ftrun::ParseRunnerOptions(argc, argv, &options, &help);
  if (!s.ok()) {
    std::fprintf(help ? stdout : stderr, "%s\n", s.message().c_str());
    return help ? 0 : 2;
  }
  ftrun::InitLogging("ftrun", -1, -1, options.quiet ? "warn" : options.log_level);
  return ftrun::RunJob(options);
}
