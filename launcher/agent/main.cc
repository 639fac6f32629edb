// ftrun-agent: one per node. See launcher/agent/agent.h.
#include <cstdio>
#include <optional>
#include <string_view>

#include "launcher/agent/agent.h"
#include "launcher/agent/options.h"
#include "launcher/agent/standby.h"
#include "plugin/common/log.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "--standby") return ftrun::RunStandby(argc, argv);
  if (std::optional<int> code = ftrun::AttachToStandby(argc, argv)) return *code;
  ftrun::AgentOptions options;
  bool help = false;
  ftrun::Status s = ftrun::ParseAgentOptions(argc, argv, &options, &help);
  if (!s.ok()) {
    std::fprintf(help ? stdout : stderr, "%s\n", s.message().c_str());
    return help ? 0 : 2;
  }
  if (!ftrun::InitLogging("ftrun-agent", options.agent_id, -1, options.config.agent.log_level)) {
    std::fprintf(stderr, "ftrun-agent: agent.log_level '%s' is not one of trace|debug|info|warn|error\n",
                 options.config.agent.log_level.c_str());
    return 2;
  }
  ftrun::Agent agent(std::move(options));
  return agent.Run();
}
