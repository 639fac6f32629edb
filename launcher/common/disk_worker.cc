#include "launcher/common/disk_worker.h"

#include <sys/eventfd.h>

#include <cerrno>
#include <cstdint>

namespace ftrun {

DiskWorker::~DiskWorker() {
  cancelled_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status DiskWorker::Start() {
  event_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event_.valid()) return Status::FromErrno("eventfd (disk worker)", errno);
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void DiskWorker::Submit(Work work) {
  ++in_flight_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    work_.push_back(std::move(work));
  }
  cv_.notify_one();
}

void DiskWorker::RunCompleted() {
  uint64_t n = 0;
  (void)!::read(event_.get(), &n, sizeof(n));
  std::deque<Completion> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done.swap(done_);
  }
  for (Completion& c : done) {
    --in_flight_;
    if (c) c();
  }
}

void DiskWorker::Run() {
  for (;;) {
    Work w;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !work_.empty(); });
      if (stop_) return;
      w = std::move(work_.front());
      work_.pop_front();
    }
    Completion c = w();
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_.push_back(std::move(c));
    }
    uint64_t one = 1;
    (void)!::write(event_.get(), &one, sizeof(one));
  }
}

}  // namespace ftrun
