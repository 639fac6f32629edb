#include "launcher/agent/cgroup_join.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ftrun {
namespace {

bool IsCgroup2(const std::string& path) {
  struct statfs fs {};
  return ::statfs(path.c_str(), &fs) == 0 && fs.f_type == static_cast<decltype(fs.f_type)>(CGROUP2_SUPER_MAGIC);
}

// cgroup v2 at /sys/fs/cgroup (unified), or at /sys/fs/cgroup/unified next
// to v1 hierarchies (hybrid). Empty when the host has no v2 hierarchy.
std::string V2Root(bool* hybrid) {
  *hybrid = false;
  if (IsCgroup2("/sys/fs/cgroup")) return "/sys/fs/cgroup";
  if (IsCgroup2("/sys/fs/cgroup/unified")) {
    *hybrid = true;
    return "/sys/fs/cgroup/unified";
  }
  return "";
}

Status ReadCgroupV2Path(pid_t pid, std::string* path) {
  std::string file = "/proc/" + std::to_string(pid) + "/cgroup";
  std::ifstream in(file);
  if (!in) return Status::FromErrno("read " + file, errno);
  std::stringstream text;
  text << in.rdbuf();
  return ParseCgroupV2Path(text.str(), path);
}

}  // namespace

Status ParseCgroupV2Path(std::string_view text, std::string* path) {
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    std::string p = line.substr(3);
    if (p.empty() || p[0] != '/') return Status::InvalidArgument("cgroup v2 path '" + p + "' is not absolute");
    for (char c : p) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        return Status::InvalidArgument("cgroup v2 path has a control character");
      }
    }
    if (p.size() >= 10 && p.compare(p.size() - 10, 10, " (deleted)") == 0) {
      return Status::NotFound("cgroup " + p + " was removed");
    }
    std::istringstream parts(p);
    for (std::string part; std::getline(parts, part, '/');) {
      if (part == "." || part == "..")
        return Status::InvalidArgument("cgroup v2 path '" + p + "' has a '" + part + "' component");
    }
    *path = p;
    return Status::Ok();
  }
  return Status::NotFound("no cgroup v2 entry (0::) in /proc/<pid>/cgroup: a cgroup v1 host");
}

Status ResolveCgroupDir(const std::string& root, const std::string& path, std::string* dir) {
  if (root != "/sys/fs/cgroup" && root != "/sys/fs/cgroup/unified") {
    return Status::InvalidArgument("cgroup root " + root + " is not /sys/fs/cgroup or /sys/fs/cgroup/unified");
  }
  std::string want = path == "/" ? root : root + path;
  while (want.size() > root.size() && want.back() == '/') want.pop_back();
  char real[PATH_MAX];
  if (::realpath(want.c_str(), real) == nullptr) return Status::FromErrno("cgroup " + want, errno);
  if (want != real) return Status::InvalidArgument("cgroup " + want + " resolves to " + real);
  if (want != root && want.compare(0, root.size() + 1, root + "/") != 0) {
    return Status::InvalidArgument("cgroup " + want + " is not under " + root);
  }
  if (!IsCgroup2(want)) return Status::InvalidArgument(want + " is not a cgroup v2 directory");
  *dir = want;
  return Status::Ok();
}

CgroupTarget CgroupOf(pid_t pid) {
  CgroupTarget t;
  bool hybrid = false;
  std::string root = V2Root(&hybrid);
  if (root.empty()) {
    t.warning =
        "this host has no cgroup v2 hierarchy (cgroup v1): the agent and its ranks stay in the standby's "
        "cgroups, outside the job's limits";
    return t;
  }
  std::string path, ours;
  Status s = ReadCgroupV2Path(pid, &path);
  // Already there (the attacher runs where the standby does): nothing to join.
  const bool same = s.ok() && ReadCgroupV2Path(::getpid(), &ours).ok() && ours == path;
  if (s.ok() && !same) s = ResolveCgroupDir(root, path, &t.dir);
  if (s.ok() && !same) {
    t.procs.Reset(::open((t.dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!t.procs.valid()) s = Status::FromErrno("open " + t.dir + "/cgroup.procs", errno);
  }
  if (!s.ok()) {
    t.warning = "cannot join the attaching process's cgroup (" + s.message() +
                "): the agent and its ranks stay in the standby's cgroup, outside the job's limits";
  } else if (hybrid) {
    t.warning = "hybrid cgroup host: " +
                (same ? "the job's cgroup v2 is the standby's" : "joined the job's cgroup v2 " + t.dir) +
                "; limits the job has in cgroup v1 hierarchies (devices, memory, cpuset) do not apply to the agent and "
                "its ranks";
  }
  return t;
}

int JoinCgroup(const CgroupTarget& t) {
  if (!t.procs.valid()) return EBADF;
  // The pid in decimal, without snprintf (not async-signal-safe).
  char buf[24];
  int n = 0;
  char rev[24];
  for (pid_t p = ::getpid(); p > 0; p /= 10) rev[n++] = static_cast<char>('0' + p % 10);
  for (int i = 0; i < n; ++i) buf[i] = rev[n - 1 - i];
  buf[n++] = '\n';
  return ::write(t.procs.get(), buf, static_cast<size_t>(n)) == n ? 0 : errno;
}

}  // namespace ftrun
