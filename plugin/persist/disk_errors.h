// What a failed disk access means for a restore, decided in one place.
//
//  - kTransient: the same read may succeed if retried (EIO, ESTALE, EINTR,
//    EAGAIN, ETIMEDOUT: a flaky disk, an NFS server failing over). Retried
//    with a bounded backoff (RetryTransient); if it still fails, the restore
//    stops with an error and nothing is deleted: the version stays on disk.
//  - kVersionBad: a verified corruption (a hash or size mismatch) or a
//    missing file. The version cannot be restored; the job may go back to an
//    older one (its files are kept until the job commits a newer version).
//  - kOther: anything else (EACCES, another job's files): an older version
//    would fail the same way; the restore stops with the error.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "ftrun/status.h"

namespace ftrun {

enum class DiskErrorClass { kTransient, kVersionBad, kOther };

// The Status of a failed system call on a persist file: kNotFound for
// ENOENT, kIoTransient for the transient errnos above, else kIoError.
// `what` names the call and the path ("cannot read 'p'").
Status DiskErrno(const std::string& what, int err);
bool IsTransientErrno(int err);

DiskErrorClass ClassifyDiskError(const Status& s);
const char* DiskErrorClassName(DiskErrorClass c);

struct RetryPolicy {
  int attempts = 6;                          // tries in all, the first included
  std::chrono::milliseconds first{50};       // the wait after the first failure; doubles
  std::chrono::milliseconds max_wait{1000};  // each wait at most this
};

// Runs `fn` until it succeeds, fails with anything but a transient error, or
// has been tried policy.attempts times; sleeps between tries (call it off the
// event loop). Each retry is logged with `what`. The last error is
// returned, annotated with the number of tries when they ran out.
Status RetryTransient(const RetryPolicy& policy, const std::string& what, const std::function<Status()>& fn);

}  // namespace ftrun
