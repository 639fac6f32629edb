// The default agent.run_dir: a directory of this user's own, so users who
// share a node never share (or block each other's) run directory:
//   $XDG_RUNTIME_DIR/ftrun  when XDG_RUNTIME_DIR is set and usable (an
//                           absolute path to a directory of this user that
//                           group and others cannot write),
//   /run/user/<uid>/ftrun   else, when /run/user/<uid> is such a directory,
//   /tmp/ftrun-<uid>        else.
// Remote launchers need agent.run_dir on a filesystem every node sees (the
// job secret is a file there): set it explicitly for them.
// Thread-safe (reads the environment and stats, nothing else).
#pragma once

#include <sys/types.h>

#include <string>

namespace ftrun {

// The default for this process (effective uid, its environment).
std::string DefaultRunDir();

// The choice itself: `xdg` is $XDG_RUNTIME_DIR (nullptr when unset),
// `run_user` the directory holding per-user runtime directories ("/run/user").
std::string ChooseRunDir(const char* xdg, uid_t uid, const std::string& run_user);

}  // namespace ftrun
