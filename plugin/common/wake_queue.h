// WakeQueue: items handed from any thread to one taker whose poll loop
// watches an eventfd (fd()). Push writes the eventfd only when the queue was
// empty: Take reads the eventfd before it takes the queue (under the lock),
// so a queue that is not empty has a wake-up on its way or is about to be
// taken. Wake() wakes the taker with nothing queued (a stop).
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ftrun/status.h"
#include "plugin/common/fd.h"

namespace ftrun {

template <class T>
class WakeQueue {
 public:
  // `what`: for the error, if the eventfd cannot be made.
  Status Open(const std::string& what) {
    fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    return fd_.valid() ? Status::Ok() : Status::FromErrno("eventfd (" + what + ")", errno);
  }
  int fd() const { return fd_.get(); }

  void Push(T item) {
    bool wake;
    {
      std::lock_guard<std::mutex> l(mu_);
      wake = items_.empty();
      items_.push_back(std::move(item));
    }
    if (wake) Wake();
  }
  void Wake() {
    uint64_t one = 1;
    if (fd_.valid()) (void)!::write(fd_.get(), &one, sizeof(one));
  }
  // The wake-up read, then everything queued, in order: for a taker that
  // takes each time fd() is readable.
  std::vector<T> Take() {
    ClearWake();
    return TakeQueued();
  }
  // For a taker that takes on every pass of its loop, with no syscall, and
  // reads the wake-up (ClearWake) only when its poll says fd() is readable.
  std::vector<T> TakeQueued() {
    std::lock_guard<std::mutex> l(mu_);
    return std::exchange(items_, {});
  }
  void ClearWake() {
    uint64_t n;
    (void)!::read(fd_.get(), &n, sizeof(n));
  }

 private:
  UniqueFd fd_;
  std::mutex mu_;  // guards items_
  std::vector<T> items_;
};

}  // namespace ftrun
