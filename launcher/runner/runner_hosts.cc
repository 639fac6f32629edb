// Where the runner's agents run and listen: host addresses and the agent binary's directory (runner_impl.h).
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

#include "launcher/common/supervisor.h"
#include "launcher/runner/hostfile.h"
#include "launcher/runner/remote_command.h"
#include "launcher/runner/runner_impl.h"
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
namespace runner_impl {

// The first IPv4 address of `host`, for agents and the coordinator that
// remote launchers start elsewhere.
Status ResolveIpv4(const std::string& host, const std::string& what, std::string* out) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::InvalidArgument(what + " '" + host + "': cannot resolve it to an IPv4 address (" +
                                   ::gai_strerror(rc) + "); give the address instead");
  }
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  ::freeaddrinfo(res);
  *out = buf;
  return Status::Ok();
}

std::string SelfDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

// --agent_addr: a template ("10.0.0.{node}") or one address per agent,
// comma-separated.
Status AgentAddress(const std::string& spec, int agent, std::string* out) {
  if (spec.find(',') == std::string::npos) {
    *out = ExpandNodeTemplate(spec, agent);
    return Status::Ok();
  }
  std::vector<std::string> list;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    list.push_back(spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (agent >= static_cast<int>(list.size())) {
    return Status::InvalidArgument("--agent_addr lists " + std::to_string(list.size()) + " addresses, agent " +
                                   std::to_string(agent) + " needs one (nodes + spares)");
  }
  *out = list[static_cast<size_t>(agent)];
  return Status::Ok();
}

}  // namespace runner_impl
}  // namespace ftrun
