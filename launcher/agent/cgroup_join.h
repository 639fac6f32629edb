// Joining the job's cgroup (cgroup v2): the Slurm standby runs each agent
// outside the step, so before exec the agent joins the cgroup of the process
// that attached (the srun-started ftrun-agent, found by SO_PEERCRED), and
// the job's device, memory and cpuset limits apply to it and its ranks.
//
// Where this cannot be done the caller says so (a WARN): a cgroup v1 host
// (Slurm's cgroup/v1 plugin keeps the limits in v1 hierarchies this does not
// join), a hybrid host (only the v2 hierarchy is joined), or no permission.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "ftrun/status.h"
#include "plugin/common/fd.h"

namespace ftrun {

// The cgroup v2 path ("0::<path>") of a /proc/<pid>/cgroup text. Refuses a
// path that is not absolute, has "." or ".." components, control characters,
// or belongs to a removed cgroup. kNotFound when there is no v2 entry.
Status ParseCgroupV2Path(std::string_view proc_cgroup, std::string* path);

// The directory of cgroup `path` under the v2 mount `root`, checked: it
// resolves (realpath) to itself, lies under root, and is a cgroup v2
// directory (statfs). root is /sys/fs/cgroup or /sys/fs/cgroup/unified.
Status ResolveCgroupDir(const std::string& root, const std::string& path, std::string* dir);

struct CgroupTarget {
  UniqueFd procs;       // <dir>/cgroup.procs, open for writing; invalid when none
  std::string dir;      // the cgroup directory
  std::string warning;  // why the join is partial or impossible; empty when complete
};

// Finds the cgroup v2 mount, reads /proc/<pid>/cgroup and opens that
// cgroup's cgroup.procs (none when it is the caller's own cgroup already).
// Never fails: what cannot be done is in warning.
CgroupTarget CgroupOf(pid_t pid);

// In a forked child, before exec: moves the calling process into the
// target's cgroup. Async-signal-safe. Returns 0 or an errno.
int JoinCgroup(const CgroupTarget& target);

}  // namespace ftrun
