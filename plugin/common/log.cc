#include "plugin/common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace ftrun {

bool InitLogging(const std::string& process, int node, int rank, const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") return false;
  auto logger = spdlog::stderr_color_mt(process);
  std::string tag =
      "[node " + std::to_string(node) + " rank " + (rank < 0 ? std::string("-") : std::to_string(rank)) + "]";
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ " + process + " " + tag + " %v");
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  spdlog::set_level(lvl);
  return true;
}

}  // namespace ftrun
