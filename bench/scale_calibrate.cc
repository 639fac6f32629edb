// ftrun-bench scale's calibration: one control message over the real
// transport (see UcxCpuPerMessage in scale_sim.h).
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "bench/scale_sim.h"
#include "plugin/transport/secret.h"
#include "plugin/transport/ucx_transport.h"

namespace ftrun::bench {
namespace {

double ProcessCpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// Polls `t` until `want` events of kind `kind` came, or 30 s passed.
constexpr int kBatch = 500;  // messages in flight at a time

bool Await(Transport* t, TransportEvent::Kind kind, int want) {
  const auto deadline = SimClock::now() + std::chrono::seconds(30);
  int got = 0;
  while (got < want) {
    if (SimClock::now() >= deadline) return false;
    pollfd p{t->event_fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
    for (const TransportEvent& e : t->Poll()) got += e.kind == kind;
  }
  return true;
}

// The agent's side, in a child process (forked before any UCX state
// exists): connects to `address`, then per batch sends kBatch held reports
// and waits for as many commits.
[[noreturn]] void AgentSide(const std::string& secret, const std::string& address, int batches) {
  UcxTransportOptions o;
  o.self = 1;
  o.secret = secret;
  std::unique_ptr<Transport> agent;
  if (!CreateUcxTransport(o, &agent).ok()) ::_exit(3);
  agent->Connect(kCoordinatorPeer, address);
  if (!Await(agent.get(), TransportEvent::Kind::kPeerUp, 1)) ::_exit(4);
  std::vector<RankVersion> items;
  for (int r = 0; r < 8; ++r) items.push_back({r, 1});
  const std::string held = Encode(HeldMsg{0, items});
  for (int b = 0; b < batches; ++b) {
    for (int i = 0; i < kBatch; ++i) agent->Send(kCoordinatorPeer, static_cast<uint16_t>(ClusterMsg::kHeld), held);
    if (!Await(agent.get(), TransportEvent::Kind::kMessage, kBatch)) ::_exit(5);
  }
  ::_exit(0);
}

}  // namespace

double UcxCpuPerMessage(int messages, std::string* error) {
  char dir[] = "/tmp/ftrun-scale-XXXXXX";
  if (::mkdtemp(dir) == nullptr) {
    *error = "mkdtemp /tmp/ftrun-scale-XXXXXX failed";
    return -1;
  }
  const std::string secret_file = std::string(dir) + "/secret";
  UcxTransportOptions o;
  Status s = WriteNewSecretFile(secret_file);
  if (s.ok()) s = ReadSecretFile(secret_file, &o.secret);
  ::unlink(secret_file.c_str());
  ::rmdir(dir);
  if (!s.ok()) {
    *error = s.ToString();
    return -1;
  }
  const int batches = (messages + kBatch - 1) / kBatch;
  int fds[2];
  if (::pipe(fds) != 0) {
    *error = "pipe failed";
    return -1;
  }
  const pid_t child = ::fork();
  if (child < 0) {
    *error = "fork failed";
    return -1;
  }
  if (child == 0) {
    ::close(fds[1]);
    std::string address;
    char c;
    while (::read(fds[0], &c, 1) == 1 && c != '\n') address.push_back(c);
    AgentSide(o.secret, address, batches);
  }
  ::close(fds[0]);
  // The coordinator's side, in this process: its CPU is what is measured.
  std::unique_ptr<Transport> coordinator;
  o.self = kCoordinatorPeer;
  s = CreateUcxTransport(o, &coordinator);
  const std::string line = s.ok() ? coordinator->address() + "\n" : "\n";
  (void)!::write(fds[1], line.data(), line.size());
  ::close(fds[1]);
  double per_message = -1;
  if (!s.ok()) {
    *error = s.ToString();
  } else if (!Await(coordinator.get(), TransportEvent::Kind::kPeerUp, 1)) {
    *error = "the agent side did not connect within 30 s";
  } else {
    const std::string commit = Encode(CommitMsg{1, 0});
    const double cpu0 = ProcessCpuSeconds();
    bool ok = true;
    for (int b = 0; b < batches && ok; ++b) {
      ok = Await(coordinator.get(), TransportEvent::Kind::kMessage, kBatch);
      for (int i = 0; i < kBatch && ok; ++i) coordinator->Send(1, static_cast<uint16_t>(ClusterMsg::kCommit), commit);
    }
    if (ok)
      per_message = (ProcessCpuSeconds() - cpu0) / (2.0 * batches * kBatch);
    else
      *error = "messages did not arrive within 30 s";
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  if (per_message >= 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    *error = "the agent side failed (status " + std::to_string(status) + ")";
    per_message = -1;
  }
  return per_message;
}

}  // namespace ftrun::bench
