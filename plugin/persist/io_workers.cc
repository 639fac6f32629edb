// IoWorkers: a bounded job queue on a few threads; the first failure sticks.
#include "plugin/persist/io_workers.h"

namespace ftrun {

IoWorkers::IoWorkers(int threads, size_t max_queued) : max_queued_(max_queued < 1 ? 1 : max_queued) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

IoWorkers::~IoWorkers() { (void)Finish(); }

Status IoWorkers::Submit(std::function<Status()> job) {
  if (threads_.empty()) {
    if (!error_.ok()) return error_;
    error_ = job();
    return error_;
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.size() < max_queued_ || !error_.ok(); });
  if (!error_.ok()) return error_;
  queue_.push_back(std::move(job));
  cv_.notify_all();
  return Status::Ok();
}

void IoWorkers::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !queue_.empty() || closing_; });
    if (queue_.empty()) return;  // closing, and nothing left
    std::function<Status()> job = std::move(queue_.front());
    queue_.pop_front();
    cv_.notify_all();            // room for Submit
    if (!error_.ok()) continue;  // dropped: a job failed before
    lock.unlock();
    Status st = job();
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
