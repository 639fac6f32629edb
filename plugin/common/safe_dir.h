// SafeDir: directories and files that only this user can have written.
// One place for the rules the run directory (agent.run_dir: sockets, locks,
// the job secret, runner.json, status.json) and pid files follow:
//
//   * every component of a trusted directory path is opened with openat
//     (O_NOFOLLOW | O_DIRECTORY) from "/" and fstat'ed: it is owned by this
//     user or by root, and not writable by group or others unless it is a
//     sticky directory owned by root (like /tmp); the last component (the
//     directory itself) must be owned by this user and not writable by group
//     or others at all, and must not be a symbolic link. An intermediate
//     component may be a symbolic link only if this user or root owns the
//     link (nobody else can have planted it there); it is then followed.
//   * files are created with O_CREAT | O_EXCL | O_NOFOLLOW, or written under a
//     temporary name created so in the checked directory and renamed over the
//     final name, which must not be a symbolic link or another user's file.
//   * files are read only when they are regular files owned by this user and
//     not writable by group or others.
//
// Errors are FailedPrecondition (a check failed) or the errno's code, with a
// message naming the path, what was found, and what was expected. "This user"
// is the effective uid. All functions are thread-safe and never throw.
#pragma once

#include <sys/types.h>

#include <string>

#include "ftrun/status.h"
#include "plugin/common/fd.h"

namespace ftrun {

// Opens the directory `path` (relative paths start at the working
// directory), checking every component as above. With `create`, missing
// components are made (mode 0700). `what` names the directory for the user,
// e.g. "agent.run_dir".
Status OpenPrivateDir(const std::string& path, bool create, const std::string& what, UniqueFd* out);

// Opens (creating it, mode 0600, if missing) the file `name` in the checked
// directory `dir_fd` (whose path is `dir_path`, for messages) without
// following a symlink; refuses anything but a regular file of this user that
// group and others cannot write. `flags` adds to O_CLOEXEC | O_NOFOLLOW | O_CREAT.
Status OpenOwnFileAt(int dir_fd, const std::string& dir_path, const std::string& name, int flags, UniqueFd* out);

// Replaces `dir_path/name` with `data` (mode `mode`): written to a temporary
// name created with O_EXCL | O_NOFOLLOW in `dir_fd`, then renamed over `name`.
// An existing `name` that is a symlink, not a regular file, or another user's
// file is refused and left as it is.
Status ReplaceFileAt(int dir_fd, const std::string& dir_path, const std::string& name, const std::string& data,
                     mode_t mode = 0600);

// ReplaceFileAt for a path. With `check_dir` its directory is opened with
// OpenPrivateDir (no create); without, plainly (a directory the user chose,
// such as --status_file's): the write still never follows a symlink.
Status ReplaceFile(const std::string& path, const std::string& data, bool check_dir, mode_t mode = 0600);

// Creates the new file `path` (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600) with
// `data`, for pid files in shared directories like /tmp. A regular file of
// this user already there (an earlier run's) is replaced; anything else
// there (a symlink, another user's file) is refused.
Status CreateNewFile(const std::string& path, const std::string& data);

// Reads `path` (at most `max_bytes`) after checking its directory
// (OpenPrivateDir, no create) and the file itself: a regular file, not a
// symlink, owned by this user, not writable by group or others.
Status ReadPrivateFile(const std::string& path, size_t max_bytes, std::string* out);

}  // namespace ftrun
