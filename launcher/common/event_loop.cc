#include "launcher/common/event_loop.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>

namespace ftrun {

Status EventLoop::Open(const std::vector<int>& signals, std::chrono::nanoseconds tick) {
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : signals) sigaddset(&mask, sig);
  if (::sigprocmask(SIG_BLOCK, &mask, nullptr) != 0) return Status::FromErrno("sigprocmask", errno);
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) return Status::FromErrno("epoll_create1", errno);
  signal_fd_.Reset(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signal_fd_.valid()) return Status::FromErrno("signalfd", errno);
  timer_fd_.Reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!timer_fd_.valid()) return Status::FromErrno("timerfd_create", errno);
  itimerspec its{};
  its.it_interval.tv_sec = static_cast<time_t>(tick.count() / 1'000'000'000);
  its.it_interval.tv_nsec = static_cast<long>(tick.count() % 1'000'000'000);
  its.it_value = its.it_interval;
  if (::timerfd_settime(timer_fd_.get(), 0, &its, nullptr) != 0) return Status::FromErrno("timerfd_settime", errno);
  FTRUN_RETURN_IF_ERROR(Add(signal_fd_.get(), kSignalTag));
  return Add(timer_fd_.get(), kTickTag);
}

Status EventLoop::Add(int fd, uint64_t tag, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return Status::FromErrno("epoll_ctl add", errno);
  return Status::Ok();
}

Status EventLoop::Modify(int fd, uint64_t tag, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev) != 0) return Status::FromErrno("epoll_ctl mod", errno);
  return Status::Ok();
}

void EventLoop::Remove(int fd) { ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr); }

Status EventLoop::Wait(std::vector<Ready>* out) {
  epoll_event events[64];
  out->clear();
  while (true) {
    int n = ::epoll_wait(epoll_.get(), events, 64, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("epoll_wait", errno);
    for (int i = 0; i < n; ++i) out->push_back({events[i].data.u64, events[i].events});
    return Status::Ok();
  }
}

std::vector<int> EventLoop::TakeSignals() {
  std::vector<int> out;
  signalfd_siginfo si;
  while (::read(signal_fd_.get(), &si, sizeof(si)) == sizeof(si)) out.push_back(static_cast<int>(si.ssi_signo));
  return out;
}

void EventLoop::TakeTicks() {
  uint64_t expirations;
  while (::read(timer_fd_.get(), &expirations, sizeof(expirations)) > 0) {
  }
}

}  // namespace ftrun
