// Logging: spdlog with every line tagged "[node N rank R]" (rank "-" for
// the agent itself). Call InitLogging once per process, before any thread.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace ftrun {

// level: trace|debug|info|warn|error. Returns false on an unknown level.
bool InitLogging(const std::string& process, int node, int rank, const std::string& level);

}  // namespace ftrun

#define FTRUN_LOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define FTRUN_LOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define FTRUN_LOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
#define FTRUN_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
