#include "launcher/agent/instance_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "plugin/common/safe_dir.h"

namespace ftrun {

InstanceLock::~InstanceLock() {
  // Remove the socket while still holding the lock, so no new agent can
  // mistake our socket for its own.
  if (lock_fd_.valid() && !socket_path_.empty()) ::unlink(socket_path_.c_str());
}

Status InstanceLock::Claim(const std::string& run_dir, const std::string& job_id, int node, InstanceLock* out) {
  // Every component checked (safe_dir.h): nobody else can have planted the
  // lock, or a link where our socket goes.
  UniqueFd dir;
  FTRUN_RETURN_IF_ERROR(OpenPrivateDir(run_dir, true, "agent.run_dir", &dir));
  const std::string name = job_id + ".node" + std::to_string(node);
  const std::string stem = run_dir + "/" + name;
  InstanceLock l;
  l.lock_path_ = stem + ".lock";
  l.socket_path_ = stem + ".sock";
  FTRUN_RETURN_IF_ERROR(OpenOwnFileAt(dir.get(), run_dir, name + ".lock", O_RDWR, &l.lock_fd_));
  if (::flock(l.lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    if (err != EWOULDBLOCK) return Status::FromErrno("flock " + l.lock_path_, err);
    char buf[32] = {0};
    (void)!::pread(l.lock_fd_.get(), buf, sizeof(buf) - 1, 0);
    l.socket_path_.clear();  // not ours: the destructor must not unlink it
    return Status::AlreadyExists("another ftrun-agent (pid " + std::to_string(std::atoi(buf)) +
                                 ") already serves job '" + job_id + "' node " + std::to_string(node) + " on socket " +
                                 stem + ".sock");
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(l.lock_fd_.get(), 0) != 0 ||
      ::pwrite(l.lock_fd_.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return Status::FromErrno("write " + l.lock_path_, errno);
  }
  if (::unlinkat(dir.get(), (name + ".sock").c_str(), 0) == 0) {
    l.removed_stale_ = true;
  } else if (errno != ENOENT) {
    return Status::FromErrno("remove stale socket " + l.socket_path_, errno);
  }
  *out = std::move(l);
  return Status::Ok();
}

}  // namespace ftrun
