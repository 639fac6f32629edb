// DiskWorker: one thread for the agent's bulk disk work (a restore from the
// persist directory reads GiB), so that the event loop keeps heartbeating,
// serving ranks and peers meanwhile.
//
// Work goes in as a closure that runs on the worker thread and returns a
// completion; the completion runs on the event loop (RunCompleted, when
// event_fd() is readable), which owns every piece of agent state. A work
// closure touches only its own captures and what the loop lent it for its
// duration (arena extents the store reserved for it, a reader).
//
// Threads: Submit, RunCompleted and busy() on the loop only. The destructor
// sets cancelled() (long work checks it between reads), then joins.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "ftrun/status.h"
#include "plugin/common/fd.h"

namespace ftrun {

class DiskWorker {
 public:
  using Completion = std::function<void()>;
  using Work = std::function<Completion()>;

  DiskWorker() = default;
  ~DiskWorker();
  DiskWorker(const DiskWorker&) = delete;
  DiskWorker& operator=(const DiskWorker&) = delete;

  Status Start();
  int event_fd() const { return event_.get(); }
  void Submit(Work work);
  // Runs the completions of finished work, in submission order.
  void RunCompleted();
  // Work submitted whose completion has not run yet.
  bool busy() const { return in_flight_ > 0; }
  const std::atomic<bool>& cancelled() const { return cancelled_; }

 private:
  void Run();

  // Constant after Start.
  UniqueFd event_;
  std::thread thread_;

  std::atomic<bool> cancelled_{false};
  int in_flight_ = 0;  // Loop thread only.

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> work_;        // Guarded by mu_
  std::deque<Completion> done_;  // Guarded by mu_
  bool stop_ = false;            // Guarded by mu_
};

}  // namespace ftrun
