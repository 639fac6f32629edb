// IoWorkers: a bounded job queue on a few threads; the first failure sticks.
#include "plugin/persist/io_workers.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

namespace ftrun {

IoWorkers::IoWorkers(int threads, size_t max_queued, int nice) : max_queued_(max_queued < 1 ? 1 : max_queued) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this, nice] { Run(nice); });
}

IoWorkers::~IoWorkers() { (void)Finish(); }

Status IoWorkers::Submit(std::function<Status()> job) {
  std::unique_lock<std::mutex> lock(mu_);
  if (threads_.empty()) {
    if (!error_.ok()) return error_;
    lock.unlock();
    Status st = job();
    job = nullptr;  // what it holds goes now, as a worker's job would
    lock.lock();
    if (!st.ok() && error_.ok()) error_ = std::move(st);
    return error_;
  }
  cv_.wait(lock, [&] { return queue_.size() < max_queued_ || !error_.ok(); });
  if (!error_.ok()) return error_;
  queue_.push_back(std::move(job));
  cv_.notify_all();
  return Status::Ok();
}

void IoWorkers::Run(int nice) {
  if (nice > 0) {
    // Linux: a thread's nice value and policy are its own; lowering them
    // needs no privilege.
    const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
    (void)::setpriority(PRIO_PROCESS, tid, std::max(nice, ::getpriority(PRIO_PROCESS, tid)));
    if (nice >= 19) {
      // SCHED_IDLE: any other thread that wakes up on this CPU preempts it at
      // once; a nice 19 thread of the normal policy may finish its slice first.
      sched_param none{};
      (void)::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &none);
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !queue_.empty() || closing_; });
    if (queue_.empty()) return;  // closing, and nothing left
    std::function<Status()> job = std::move(queue_.front());
    queue_.pop_front();
    cv_.notify_all();    // room for Submit
    if (!error_.ok()) {  // dropped: a job failed before
      lock.unlock();
      job = nullptr;  // its captures may clean up (delete a tmp file)
      lock.lock();
      continue;
    }
    lock.unlock();
    Status st = job();
    job = nullptr;
    lock.lock();
    if (!st.ok() && error_.ok()) {
      error_ = std::move(st);
      cv_.notify_all();
    }
  }
}

Status IoWorkers::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    cv_.notify_all();
  }
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

}  // namespace ftrun
