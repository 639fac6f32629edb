// EventLoop: the epoll, signalfd and periodic timerfd that a process's one
// event loop runs on: the agent's and the runner's. The owner keeps its own
// dispatch: it adds sources under tags of its choice and, for each ready
// one, gets the tag back.
//
// Open blocks the signals it is given in the calling thread first, so call
// it before starting any thread: threads inherit the mask, and the signals
// then arrive only here (TakeSignals), never as asynchronous handlers.
//
// Not thread-safe: one thread owns it.
#pragma once

#include <sys/epoll.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "ftrun/status.h"
#include "plugin/common/fd.h"

namespace ftrun {

class EventLoop {
 public:
  // Reserved tags: the signalfd (TakeSignals) and the timer (TakeTicks).
  static constexpr uint64_t kSignalTag = ~0ull;
  static constexpr uint64_t kTickTag = ~0ull - 1;

  struct Ready {
    uint64_t tag;
    uint32_t events;  // EPOLLIN, EPOLLOUT, EPOLLHUP, ...
  };

  Status Open(const std::vector<int>& signals, std::chrono::nanoseconds tick);

  Status Add(int fd, uint64_t tag, uint32_t events = EPOLLIN);
  Status Modify(int fd, uint64_t tag, uint32_t events);
  void Remove(int fd);

  // Waits until a source is ready (EINTR is waited through) and puts the
  // ready ones in `out`.
  Status Wait(std::vector<Ready>* out);
  // The signals that arrived since the last call, in arrival order.
  std::vector<int> TakeSignals();
  // Consumes the timer's expirations (call when kTickTag is ready).
  void TakeTicks();

 private:
  UniqueFd epoll_, signal_fd_, timer_fd_;
};

}  // namespace ftrun
