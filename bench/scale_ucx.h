// ftrun-bench scale --transport ucx: the same fleet and the same
// coordinator as the in-process run (scale_sim.h), but the coordinator runs
// in a process of its own on a UcxTransport, hosted as the runner hosts it,
// and every simulated agent has a UcxTransport of its own in this process
// (TCP on loopback, the job-secret session, a MAC per message). What the
// coordinator's process uses (every thread: its loop and the transport's
// progress thread) is what is measured.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/scale_sim.h"
#include "plugin/transport/transport.h"

namespace ftrun::bench {

// What the coordinator's process reports when asked.
struct CoordinatorSample {
  double cpu_seconds = 0;  // its whole process (getrusage)
  uint64_t messages_in = 0, messages_out = 0;
};

class UcxCoordinatorProcess {
 public:
  ~UcxCoordinatorProcess() { Stop(); }
  // Ends the process (before the agents' transports close: it would log their losses).
  void Stop();
  // Forks the coordinator (call it before this process has any UCX state).
  Status Start(const Coordinator::Options& options, const std::string& secret);
  const std::string& address() const { return address_; }
  Status Sample(CoordinatorSample* out);

 private:
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string address_;
};

// The fleet's side: one UcxTransport per simulated agent (ids 1..agents),
// connected to the coordinator; what the fleet pushes to `to_coordinator`
// goes out on the sending agent's transport, and what any transport
// receives is pushed to `to_agents`.
class UcxFleetLink {
 public:
  UcxFleetLink(Mailbox* to_coordinator, Mailbox* to_agents) : to_coordinator_(to_coordinator), to_agents_(to_agents) {}
  ~UcxFleetLink();
  // Creates the transports and waits until every one is up (60 s at most).
  Status Start(int agents, const std::string& secret, const std::string& coordinator_address);

 private:
  void SendLoop();
  void ReceiveLoop();

  Mailbox* to_coordinator_;
  Mailbox* to_agents_;
  std::vector<std::unique_ptr<Transport>> transports_;  // index id - 1
  int epoll_ = -1;
  std::atomic<bool> stop_{false};
  std::thread sender_, receiver_;
};

// A new job secret (through a file, as a job's is made).
Status NewBenchSecret(std::string* secret);

}  // namespace ftrun::bench
