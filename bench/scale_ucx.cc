// ftrun-bench scale over UCX (see scale_ucx.h).
#include "bench/scale_ucx.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "plugin/transport/secret.h"
#include "plugin/transport/ucx_transport.h"

namespace ftrun::bench {
namespace {

using std::chrono::milliseconds;

double ProcessCpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// Reads one line from `fd` within `timeout`; false on EOF or timeout.
bool ReadLine(int fd, std::string* line, milliseconds timeout) {
  line->clear();
  const SimTime deadline = SimClock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - SimClock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char c;
    if (::read(fd, &c, 1) != 1) return false;
    if (c == '\n') return true;
    line->push_back(c);
  }
}

class CountingOutbox : public Coordinator::Outbox {
 public:
  explicit CountingOutbox(Transport* t) : t_(t) {}
  void Send(PeerId to, ClusterMsg type, std::string payload) override {
    ++sent;
    t_->Send(to, static_cast<uint16_t>(type), std::move(payload));
  }
  void Disconnect(PeerId peer) override { t_->Disconnect(peer); }
  uint64_t sent = 0;

 private:
  Transport* t_;
};

// The coordinator's process: its loop is the runner's (runner.cc Loop):
// transport events as they come, then RunnerTimers. A byte 'S' on `in_fd`
// asks for a sample; 'Q' or EOF ends it.
[[noreturn]] void CoordinatorMain(Coordinator::Options options, const std::string& secret, int in_fd, int out_fd) {
  UcxTransportOptions t;
  t.self = kCoordinatorPeer;
  t.secret = secret;
  std::unique_ptr<Transport> transport;
  const Status s = CreateUcxTransport(t, &transport);
  const std::string first = s.ok() ? transport->address() + "\n" : "\n";
  (void)!::write(out_fd, first.data(), first.size());
  if (!s.ok()) ::_exit(3);
  CountingOutbox outbox(transport.get());
  Coordinator coordinator(std::move(options), &outbox);
  RunnerTimers timers(&coordinator);
  uint64_t in = 0;
  while (true) {
    const auto wait = std::chrono::duration_cast<milliseconds>(timers.next_tick() - SimClock::now()).count() + 1;
    pollfd p[2] = {{transport->event_fd(), POLLIN, 0}, {in_fd, POLLIN, 0}};
    ::poll(p, 2, static_cast<int>(std::max<int64_t>(wait, 0)));
    const SimTime now = SimClock::now();
    if (p[0].revents != 0) {
      for (TransportEvent& e : transport->Poll()) {
        if (e.kind == TransportEvent::Kind::kMessage) {
          ++in;
          coordinator.OnMessage(e.peer, e.type, e.payload, now);
        } else if (e.kind == TransportEvent::Kind::kPeerDown) {
          coordinator.OnPeerDown(e.peer, e.status.message(), now);
        }
      }
    }
    timers.Run(now);
    if (p[1].revents != 0) {
      char c = 0;
      if (::read(in_fd, &c, 1) != 1 || c != 'S') ::_exit(0);
      char line[128];
      const int n = std::snprintf(line, sizeof(line), "%.6f %llu %llu\n", ProcessCpuSeconds(),
                                  static_cast<unsigned long long>(in), static_cast<unsigned long long>(outbox.sent));
      (void)!::write(out_fd, line, static_cast<size_t>(n));
    }
  }
}

}  // namespace

Status NewBenchSecret(std::string* secret) {
  char dir[] = "/tmp/ftrun-scale-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return Status::FromErrno("mkdtemp /tmp/ftrun-scale-XXXXXX", errno);
  const std::string file = std::string(dir) + "/secret";
  Status s = WriteNewSecretFile(file);
  if (s.ok()) s = ReadSecretFile(file, secret);
  ::unlink(file.c_str());
  ::rmdir(dir);
  return s;
}

void UcxCoordinatorProcess::Stop() {
  if (pid_ <= 0) return;
  (void)!::write(to_child_, "Q", 1);
  ::close(to_child_);
  std::string rest;
  ReadLine(from_child_, &rest, milliseconds(5000));  // EOF once it is gone
  ::close(from_child_);
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

Status UcxCoordinatorProcess::Start(const Coordinator::Options& options, const std::string& secret) {
  int down[2], up[2];
  if (::pipe2(down, O_CLOEXEC) != 0 || ::pipe2(up, O_CLOEXEC) != 0) return Status::FromErrno("pipe", errno);
  pid_ = ::fork();
  if (pid_ < 0) return Status::FromErrno("fork", errno);
  if (pid_ == 0) {
    ::close(down[1]);
    ::close(up[0]);
    CoordinatorMain(options, secret, down[0], up[1]);
  }
  ::close(down[0]);
  ::close(up[1]);
  to_child_ = down[1];
  from_child_ = up[0];
  if (!ReadLine(from_child_, &address_, milliseconds(30000)) || address_.empty()) {
    return Status::Unavailable("the coordinator's process did not start its UCX transport");
  }
  return Status::Ok();
}

Status UcxCoordinatorProcess::Sample(CoordinatorSample* out) {
  std::string line;
  unsigned long long in = 0, sent = 0;
  if (::write(to_child_, "S", 1) != 1 || !ReadLine(from_child_, &line, milliseconds(10000)) ||
      std::sscanf(line.c_str(), "%lf %llu %llu", &out->cpu_seconds, &in, &sent) != 3) {
    return Status::Unavailable("the coordinator's process did not answer a sample request");
  }
  out->messages_in = in;
  out->messages_out = sent;
  return Status::Ok();
}

UcxFleetLink::~UcxFleetLink() {
  stop_ = true;
  if (sender_.joinable()) {
    to_coordinator_->Push({});  // wakes it
    sender_.join();
  }
  if (receiver_.joinable()) receiver_.join();
  if (epoll_ >= 0) ::close(epoll_);
}

Status UcxFleetLink::Start(int agents, const std::string& secret, const std::string& coordinator_address) {
  epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_ < 0) return Status::FromErrno("epoll_create1", errno);
  for (int i = 0; i < agents; ++i) {
    UcxTransportOptions o;
    o.self = static_cast<PeerId>(i + 1);
    o.secret = secret;
    std::unique_ptr<Transport> t;
    FTRUN_RETURN_IF_ERROR(CreateUcxTransport(o, &t));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<uint32_t>(i);
    if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, t->event_fd(), &ev) != 0) return Status::FromErrno("epoll_ctl", errno);
    transports_.push_back(std::move(t));
  }
  // In waves: the coordinator's transport refuses connections beyond
  // kMaxHandshaking (64) in their handshake at once; one refused is retried.
  constexpr int kWave = 32;
  int up = 0, connecting = 0, next = 0;
  const SimTime deadline = SimClock::now() + std::chrono::seconds(120);
  epoll_event evs[64];
  while (up < agents) {
    for (; connecting < kWave && next < agents; ++next, ++connecting)
      transports_[static_cast<size_t>(next)]->Connect(kCoordinatorPeer, coordinator_address);
    if (SimClock::now() >= deadline) {
      return Status::Unavailable(std::to_string(up) + " of " + std::to_string(agents) +
                                 " simulated agents connected to the coordinator within 120 s");
    }
    const int n = ::epoll_wait(epoll_, evs, 64, 100);
    for (int i = 0; i < n; ++i) {
      Transport* t = transports_[evs[i].data.u32].get();
      for (const TransportEvent& e : t->Poll()) {
        if (e.kind == TransportEvent::Kind::kPeerUp) ++up, --connecting;
        if (e.kind == TransportEvent::Kind::kPeerDown) t->Connect(kCoordinatorPeer, coordinator_address);
      }
    }
  }
  sender_ = std::thread([this] { SendLoop(); });
  receiver_ = std::thread([this] { ReceiveLoop(); });
  return Status::Ok();
}

void UcxFleetLink::SendLoop() {
  while (!stop_) {
    for (Envelope& e : to_coordinator_->Take(SimClock::now() + milliseconds(100))) {
      if (e.peer < 1 || e.peer > transports_.size()) continue;
      if (e.type == kConnectionClosed)
        transports_[e.peer - 1]->Disconnect(kCoordinatorPeer);  // the coordinator's endpoint sees it close
      else
        transports_[e.peer - 1]->Send(kCoordinatorPeer, e.type, std::move(e.payload));
    }
  }
}

void UcxFleetLink::ReceiveLoop() {
  epoll_event evs[64];
  std::vector<Envelope> batch;
  while (!stop_) {
    const int n = ::epoll_wait(epoll_, evs, 64, 100);
    for (int i = 0; i < n; ++i) {
      const uint32_t index = evs[i].data.u32;
      for (TransportEvent& e : transports_[index]->Poll()) {
        if (e.kind == TransportEvent::Kind::kMessage) batch.push_back({index + 1, e.type, std::move(e.payload)});
      }
    }
    to_agents_->PushAll(&batch);
  }
}

}  // namespace ftrun::bench
