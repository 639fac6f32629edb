// IoWorkers: a few threads that run the flusher's blocking file jobs (write
// a chunk file and sync it, sync a directory) so that several are in flight
// while the calling thread prepares the next ones. A chunk file is synced on
// its own (fdatasync), so one writer alone leaves the disk idle during every
// sync; concurrent syncs also share the filesystem's journal commits.
//
// The queue is bounded: Submit blocks while it is full. The first failure
// sticks: later jobs are dropped, and Submit and Finish return it.
// Submit and Finish are called from one thread; jobs run on the workers.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

class IoWorkers {
 public:
  // threads 0: every job runs at once, inside Submit.
  IoWorkers(int threads, size_t max_queued);
  ~IoWorkers();  // Finish()
  IoWorkers(const IoWorkers&) = delete;
  IoWorkers& operator=(const IoWorkers&) = delete;

  // Queues `job`; returns the first failure so far (then `job` is dropped).
  Status Submit(std::function<Status()> job);
  // Waits until every queued job has run or been dropped; joins the threads.
  // Returns the first failure. Submit must not be called after it.
  Status Finish();

 private:
  void Run();

  const size_t max_queued_;  // Constant after construction
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<Status()>> queue_;  // Guarded by mu_
  bool closing_ = false;                       // Guarded by mu_
  Status error_;                               // Guarded by mu_: the first failure
};

}  // namespace ftrun
