#include "plugin/persist/disk_errors.h"

#include <cerrno>
#include <thread>

#include "plugin/common/log.h"

namespace ftrun {

bool IsTransientErrno(int err) {
  return err == EIO || err == ESTALE || err == EINTR || err == EAGAIN || err == ETIMEDOUT;
}

Status DiskErrno(const std::string& what, int err) {
  Status st = Status::FromErrno(what, err);
  if (err == ENOENT) return Status(Code::kNotFound, st.message());
  if (IsTransientErrno(err)) return Status(Code::kIoTransient, st.message());
  return st;
}

DiskErrorClass ClassifyDiskError(const Status& s) {
  switch (s.code()) {
    case Code::kIoTransient:
    case Code::kTimeout:
      return DiskErrorClass::kTransient;
    case Code::kCorruption:
    case Code::kNotFound:
      return DiskErrorClass::kVersionBad;
    default:
      return DiskErrorClass::kOther;
  }
}

const char* DiskErrorClassName(DiskErrorClass c) {
  switch (c) {
    case DiskErrorClass::kTransient:
      return "transient";
    case DiskErrorClass::kVersionBad:
      return "version unreadable";
    case DiskErrorClass::kOther:
      return "not retried";
  }
  return "?";
}

Status RetryTransient(const RetryPolicy& policy, const std::string& what, const std::function<Status()>& fn) {
  auto wait = policy.first;
  Status st;
  for (int i = 1;; ++i) {
    st = fn();
    if (st.ok() || ClassifyDiskError(st) != DiskErrorClass::kTransient) return st;
    if (i >= policy.attempts) {
      return Status(st.code(),
                    st.message() + " (a transient error, still failing after " + std::to_string(i) + " tries)");
    }
    FTRUN_LOG_WARN("{}: {}; retrying in {} ms (try {} of {})", what, st.message(), wait.count(), i + 1,
                   policy.attempts);
    std::this_thread::sleep_for(wait);
    wait = std::min(policy.max_wait, wait * 2);
  }
}

}  // namespace ftrun
