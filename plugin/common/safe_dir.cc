#include "plugin/common/safe_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <deque>
#include <vector>

namespace ftrun {
namespace {

std::string Mode(mode_t m) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

std::string Uid(uid_t u) { return "uid " + std::to_string(u); }

std::string Expected() {
  return "expected owner " + Uid(::geteuid()) + " (this user) and no write permission for group or others";
}

// Checks one directory component. `last`: the directory asked for (must be
// this user's and private), else a component on the way (root's, or sticky
// and root's when shared).
Status CheckDir(const struct stat& st, const std::string& shown, bool last, const std::string& what) {
  const uid_t me = ::geteuid();
  const std::string head = what + " '" + shown + "'";
  if (!S_ISDIR(st.st_mode)) return Status::FailedPrecondition(head + " is not a directory; expected a directory");
  if (last) {
    if (st.st_uid != me) {
      return Status::FailedPrecondition(head + " belongs to " + Uid(st.st_uid) + ", not to this user; " + Expected() +
                                        " (pick another agent.run_dir, or remove it)");
    }
    if (st.st_mode & 022) {
      return Status::FailedPrecondition(head + " is writable by group or others (mode " + Mode(st.st_mode) + "); " +
                                        Expected() + " (chmod go-w it, or pick another directory)");
    }
    return Status::Ok();
  }
  if (st.st_uid != me && st.st_uid != 0) {
    return Status::FailedPrecondition(head + " (a component of the path) belongs to " + Uid(st.st_uid) +
                                      "; expected owner root or " + Uid(me) +
                                      " (this user): another user could "
                                      "replace what is below it");
  }
  if ((st.st_mode & 022) && !((st.st_mode & S_ISVTX) && st.st_uid == 0)) {
    return Status::FailedPrecondition(head + " (a component of the path) is writable by group or others (mode " +
                                      Mode(st.st_mode) +
                                      ") and not a sticky directory owned by root like /tmp; "
                                      "expected no write permission for group or others");
  }
  return Status::Ok();
}

Status CheckFile(const struct stat& st, const std::string& path) {
  if (S_ISLNK(st.st_mode)) {
    return Status::FailedPrecondition("'" + path +
                                      "' is a symbolic link; expected a regular file (nothing is "
                                      "read or written through a link here)");
  }
  if (!S_ISREG(st.st_mode)) return Status::FailedPrecondition("'" + path + "' is not a regular file; expected one");
  if (st.st_uid != ::geteuid()) {
    return Status::FailedPrecondition("'" + path + "' belongs to " + Uid(st.st_uid) + "; " + Expected());
  }
  if (st.st_mode & 022) {
    return Status::FailedPrecondition("'" + path + "' is writable by group or others (mode " + Mode(st.st_mode) +
                                      "); " + Expected());
  }
  return Status::Ok();
}

std::deque<std::string> Split(const std::string& path) {
  std::deque<std::string> parts;
  size_t pos = 0;
  while (pos < path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string::npos) slash = path.size();
    if (slash > pos) parts.push_back(path.substr(pos, slash - pos));
    pos = slash + 1;
  }
  return parts;
}

Status OpenRoot(UniqueFd* fd, const std::string& what) {
  fd->Reset(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd->valid()) return Status::FromErrno("open /", errno);
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return Status::FromErrno("stat /", errno);
  return CheckDir(st, "/", false, what);
}

void SplitPath(const std::string& path, std::string* dir, std::string* name) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) {
    *dir = ".";
    *name = path;
  } else {
    *dir = slash == 0 ? "/" : path.substr(0, slash);
    *name = path.substr(slash + 1);
  }
}

}  // namespace

Status OpenPrivateDir(const std::string& path, bool create, const std::string& what, UniqueFd* out) {
  if (path.empty()) return Status::InvalidArgument(what + ": expected a directory path, got ''");
  std::string abs = path;
  if (abs[0] != '/') {
    char cwd[4096];
    if (::getcwd(cwd, sizeof(cwd)) == nullptr)
      return Status::FromErrno("getcwd (for " + what + " '" + path + "')", errno);
    abs = std::string(cwd) + "/" + path;
  }
  std::deque<std::string> todo = Split(abs);
  // The directories walked, "/" first: ".." (in a path or a link's target)
  // goes back to one already checked.
  std::vector<UniqueFd> chain(1);
  FTRUN_RETURN_IF_ERROR(OpenRoot(&chain[0], what));
  std::string shown;  // the path walked so far, as the user wrote it (links not resolved)
  int links = 0;
  while (!todo.empty()) {
    const std::string name = todo.front();
    todo.pop_front();
    if (name == ".") continue;
    shown += "/" + name;
    if (name == "..") {
      if (chain.size() > 1) chain.pop_back();
      if (todo.empty()) return Status::InvalidArgument(what + " '" + path + "': expected a path not ending in '..'");
      continue;
    }
    const int fd = chain.back().get();
    const bool last = todo.empty();
    UniqueFd next(::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next.valid() && errno == ENOENT && create) {
      if (::mkdirat(fd, name.c_str(), 0700) != 0 && errno != EEXIST) {
        return Status::FromErrno("cannot create " + what + " '" + shown + "'", errno);
      }
      next.Reset(::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    }
    if (!next.valid()) {
      const int err = errno;
      struct stat lst {};
      if ((err == ELOOP || err == ENOTDIR) && ::fstatat(fd, name.c_str(), &lst, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISLNK(lst.st_mode)) {
        if (last) {
          return Status::FailedPrecondition(what + " '" + shown +
                                            "' is a symbolic link; expected a real directory "
                                            "owned by " +
                                            Uid(::geteuid()) + " (this user), not a link");
        }
        if (lst.st_uid != ::geteuid() && lst.st_uid != 0) {
          return Status::FailedPrecondition(what + " '" + shown +
                                            "' (a component of the path) is a symbolic link "
                                            "owned by " +
                                            Uid(lst.st_uid) +
                                            "; expected a directory, or a link "
                                            "owned by root or this user");
        }
        if (++links > 40) return Status::FailedPrecondition(what + " '" + path + "': too many symbolic links");
        char target[4096];
        ssize_t n = ::readlinkat(fd, name.c_str(), target, sizeof(target) - 1);
        if (n <= 0) return Status::FromErrno("readlink " + shown, errno);
        std::deque<std::string> more = Split(std::string(target, static_cast<size_t>(n)));
        todo.insert(todo.begin(), more.begin(), more.end());
        if (target[0] == '/') chain.resize(1);
        // A relative target resolves from the link's own directory, which fd still is.
        continue;
      }
      return Status::FromErrno(what + " '" + shown + "'", err);
    }
    struct stat st {};
    if (::fstat(next.get(), &st) != 0) return Status::FromErrno("stat " + shown, errno);
    FTRUN_RETURN_IF_ERROR(CheckDir(st, last ? path : shown, last, what));
    chain.push_back(std::move(next));
  }
  // "/" itself asked for: never private.
  if (chain.size() == 1) return Status::FailedPrecondition(what + " '" + path + "' is '/'; " + Expected());
  *out = std::move(chain.back());
  return Status::Ok();
}

Status OpenOwnFileAt(int dir_fd, const std::string& dir_path, const std::string& name, int flags, UniqueFd* out) {
  const std::string path = dir_path + "/" + name;
  UniqueFd fd(::openat(dir_fd, name.c_str(), flags | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    const int err = errno;
    struct stat lst {};
    if (err == ELOOP && ::fstatat(dir_fd, name.c_str(), &lst, AT_SYMLINK_NOFOLLOW) == 0) return CheckFile(lst, path);
    return Status::FromErrno("cannot open " + path, err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("stat " + path, errno);
  FTRUN_RETURN_IF_ERROR(CheckFile(st, path));
  *out = std::move(fd);
  return Status::Ok();
}

Status ReplaceFileAt(int dir_fd, const std::string& dir_path, const std::string& name, const std::string& data,
                     mode_t mode) {
  const std::string path = dir_path + "/" + name;
  struct stat old {};
  if (::fstatat(dir_fd, name.c_str(), &old, AT_SYMLINK_NOFOLLOW) == 0) {
    FTRUN_RETURN_IF_ERROR(CheckFile(old, path));
  } else if (errno != ENOENT) {
    return Status::FromErrno("stat " + path, errno);
  }
  const std::string tmp = "." + name + ".tmp." + std::to_string(::getpid());
  UniqueFd fd;
  for (int attempt = 0; attempt < 2 && !fd.valid(); ++attempt) {
    fd.Reset(::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
    // An earlier process with our pid left it (or someone planted it): remove
    // the name (never follow it) and try once more.
    if (!fd.valid() && errno == EEXIST) ::unlinkat(dir_fd, tmp.c_str(), 0);
  }
  if (!fd.valid()) return Status::FromErrno("cannot create " + dir_path + "/" + tmp, errno);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::unlinkat(dir_fd, tmp.c_str(), 0);
      return Status::FromErrno("cannot write " + dir_path + "/" + tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd.get(), mode) != 0 || ::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) {
    const int err = errno;
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    return Status::FromErrno("cannot replace " + path, err);
  }
  return Status::Ok();
}

Status ReplaceFile(const std::string& path, const std::string& data, bool check_dir, mode_t mode) {
  std::string dir, name;
  SplitPath(path, &dir, &name);
  if (name.empty()) return Status::InvalidArgument("'" + path + "': expected a file path, not a directory");
  UniqueFd fd;
  if (check_dir) {
    FTRUN_RETURN_IF_ERROR(OpenPrivateDir(dir, false, "directory", &fd));
  } else {
    fd.Reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) return Status::FromErrno("cannot open directory " + dir, errno);
  }
  return ReplaceFileAt(fd.get(), dir, name, data, mode);
}

Status CreateNewFile(const std::string& path, const std::string& data) {
  std::string dir, name;
  SplitPath(path, &dir, &name);
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dfd.valid()) return Status::FromErrno("cannot open directory " + dir, errno);
  UniqueFd fd(::openat(dfd.get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid() && errno == EEXIST) {
    struct stat st {};
    if (::fstatat(dfd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
      return Status::FromErrno("stat " + path, errno);
    FTRUN_RETURN_IF_ERROR(CheckFile(st, path));
    if (::unlinkat(dfd.get(), name.c_str(), 0) != 0) return Status::FromErrno("cannot remove the old " + path, errno);
    fd.Reset(::openat(dfd.get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  }
  if (!fd.valid()) {
    return Status::FromErrno("cannot create " + path + " (expected to create it new, as a regular file of this user)",
                             errno);
  }
  if (::write(fd.get(), data.data(), data.size()) != static_cast<ssize_t>(data.size())) {
    return Status::FromErrno("cannot write " + path, errno);
  }
  return Status::Ok();
}

Status ReadPrivateFile(const std::string& path, size_t max_bytes, std::string* out) {
  std::string dir, name;
  SplitPath(path, &dir, &name);
  UniqueFd dfd;
  FTRUN_RETURN_IF_ERROR(OpenPrivateDir(dir, false, "directory", &dfd));
  UniqueFd fd(::openat(dfd.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) {
    const int err = errno;
    struct stat lst {};
    if (err == ELOOP && ::fstatat(dfd.get(), name.c_str(), &lst, AT_SYMLINK_NOFOLLOW) == 0) return CheckFile(lst, path);
    return Status::FromErrno("cannot open " + path, err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("stat " + path, errno);
  FTRUN_RETURN_IF_ERROR(CheckFile(st, path));
  std::string text;
  char buf[65536];
  while (text.size() <= max_bytes) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("cannot read " + path, errno);
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  if (text.size() > max_bytes) {
    return Status::FailedPrecondition("'" + path + "' is larger than " + std::to_string(max_bytes) +
                                      " bytes; expected a small file written by ftrun");
  }
  *out = std::move(text);
  return Status::Ok();
}

}  // namespace ftrun
