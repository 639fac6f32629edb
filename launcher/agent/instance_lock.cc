#include "launcher/agent/instance_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace ftrun {
namespace {

Status MakeDirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      cur = path.substr(0, i);
      if (::mkdir(cur.c_str(), 0700) != 0 && errno != EEXIST) return Status::FromErrno("mkdir " + cur, errno);
    }
  }
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("agent.run_dir '" + path + "' is not a directory");
  }
  if (st.st_uid != ::getuid()) {
    return Status::FailedPrecondition("agent.run_dir '" + path + "' belongs to uid " + std::to_string(st.st_uid) +
                                      ", not to this user; pick another run_dir");
  }
  return Status::Ok();
}

}  // namespace

InstanceLock::~InstanceLock() {
  // Remove the socket while still holding the lock, so no new agent can
  // mistake our socket for its own.
  if (lock_fd_.valid() && !socket_path_.empty()) ::unlink(socket_path_.c_str());
}

Status InstanceLock::Claim(const std::string& run_dir, const std::string& job_id, int node, InstanceLock* out) {
  FTRUN_RETURN_IF_ERROR(MakeDirs(run_dir));
  const std::string stem = run_dir + "/" + job_id + ".node" + std::to_string(node);
  InstanceLock l;
  l.lock_path_ = stem + ".lock";
  l.socket_path_ = stem + ".sock";
  l.lock_fd_.Reset(::open(l.lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!l.lock_fd_.valid()) return Status::FromErrno("open " + l.lock_path_, errno);
  if (::flock(l.lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    if (err != EWOULDBLOCK) return Status::FromErrno("flock " + l.lock_path_, err);
    char buf[32] = {0};
    (void)!::pread(l.lock_fd_.get(), buf, sizeof(buf) - 1, 0);
    l.socket_path_.clear();  // not ours: the destructor must not unlink it
    return Status::AlreadyExists("another ftrun-agent (pid " + std::to_string(std::atoi(buf)) +
                                 ") already serves job '" + job_id + "' node " + std::to_string(node) +
                                 " on socket " + stem + ".sock");
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(l.lock_fd_.get(), 0) != 0 ||
      ::pwrite(l.lock_fd_.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return Status::FromErrno("write " + l.lock_path_, errno);
  }
  if (::unlink(l.socket_path_.c_str()) == 0) {
    l.removed_stale_ = true;
  } else if (errno != ENOENT) {
    return Status::FromErrno("remove stale socket " + l.socket_path_, errno);
  }
  *out = std::move(l);
  return Status::Ok();
}

}  // namespace ftrun
