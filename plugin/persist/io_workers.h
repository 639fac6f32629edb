// IoWorkers: a few threads that run the flusher's blocking file jobs (write
// a chunk file; sync, close and rename one; sync a directory) so that several
// are in flight while the calling thread prepares the next ones.
//
// The queue is bounded: Submit blocks while it is full. The first failure
// sticks: later jobs are dropped (destroyed unrun, outside the lock, so what
// they capture can clean up after itself), and Submit and Finish return it.
// Submit may be called from any thread, jobs of another IoWorkers included
// (the persist writer's write jobs hand each file to its sync workers);
// Finish from one, after every Submit to it returned. Jobs run on the workers.
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
  // threads 0: every job runs at once, inside Submit. nice > 0: each worker
  // lowers its own CPU priority to it first (setpriority on the thread; best
  // effort), so that the jobs' CPU time - the filesystem's, mostly - goes to
  // whatever else wants the cores first.
  IoWorkers(int threads, size_t max_queued, int nice = 0);
  ~IoWorkers();  // Finish()
  IoWorkers(const IoWorkers&) = delete;
  IoWorkers& operator=(const IoWorkers&) = delete;

  // Queues `job`; returns the first failure so far (then `job` is dropped).
  Status Submit(std::function<Status()> job);
  // Waits until every queued job has run or been dropped; joins the threads.
  // Returns the first failure. Submit must not be called after it.
  Status Finish();

 private:
  void Run(int nice);

  const size_t max_queued_;  // Constant after construction
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<Status()>> queue_;  // Guarded by mu_
  bool closing_ = false;                       // Guarded by mu_
  Status error_;                               // Guarded by mu_: the first failure
};

}  // namespace ftrun
