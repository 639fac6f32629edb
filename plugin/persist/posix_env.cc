// PosixEnv: the real disk. Directory and metadata calls are plain POSIX;
// writes go through PosixWriteFile (O_DIRECT, io_uring); reads are pread.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <mutex>
#include <set>

#include "plugin/common/log.h"
#include "plugin/persist/disk_errors.h"
#include "plugin/persist/env.h"
#include "plugin/persist/posix_write_file.h"

namespace ftrun {
namespace {

Status Errno(const std::string& what, const std::string& path, int err) {
  return DiskErrno("cannot " + what + " '" + path + "'", err);  // kNotFound, kIoTransient or kIoError
}

class PosixReadFile : public RandomAccessFile {
 public:
  PosixReadFile(std::string path, UniqueFd fd, uint64_t size)
      : path_(std::move(path)), fd_(std::move(fd)), size_(size) {}
  Status Read(uint64_t offset, size_t n, void* dst, size_t* got) const override {
    char* p = static_cast<char*>(dst);
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd_.get(), p + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0)
        return Errno("read " + std::to_string(n) + " bytes at offset " + std::to_string(offset) + " of", path_, errno);
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    *got = done;
    return Status::Ok();
  }
  uint64_t size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  const std::string path_;
  UniqueFd fd_;
  const uint64_t size_;
};

class PosixEnvImpl : public Env {
 public:
  explicit PosixEnvImpl(const PosixEnvOptions& o) : options_(o), pool_(o.queue_depth, o.buffer_size, o.io_uring) {}

  Status NewWritableFile(const std::string& path, std::unique_ptr<WritableFile>* out) override {
    const int base = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    using Refuse = PosixEnvOptions::RefuseDirect;
    int fd = -1;
    bool direct = false;
    if (options_.direct_io) {
      fd = options_.refuse_direct == Refuse::kAtOpen ? (errno = EINVAL, -1)
                                                     : ::open(path.c_str(), base | O_DIRECT, options_.file_mode);
      direct = fd >= 0;
      if (fd < 0 && errno != EINVAL) return Errno("create", path, errno);
      if (fd < 0) LogOnce("O_DIRECT refused at open (" + path + "); writing buffered");
    }
    if (fd < 0) {
      fd = ::open(path.c_str(), base, options_.file_mode);
      if (fd < 0) return Errno("create", path, errno);
    }
    // Exactly the configured mode: the umask may have narrowed it, and an
    // existing file (a tmp name left by a crash) kept its old one.
    if (::fchmod(fd, options_.file_mode) != 0) {
      int err = errno;
      ::close(fd);
      return Errno("set the mode of", path, err);
    }
    auto file = std::make_unique<PosixWriteFile>(path, UniqueFd(fd), direct, options_.refuse_direct == Refuse::kAtWrite,
                                                 &pool_);
    LogOnce("writing with " + file->mode().ToString());
    *out = std::move(file);
    return Status::Ok();
  }

  Status NewRandomAccessFile(const std::string& path, std::unique_ptr<RandomAccessFile>* out) override {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return Errno("open", path, errno);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return Errno("stat", path, errno);
    if (S_ISDIR(st.st_mode)) return Errno("read", path, EISDIR);
    *out = std::make_unique<PosixReadFile>(path, std::move(fd), static_cast<uint64_t>(st.st_size));
    return Status::Ok();
  }

  Status CreateDir(const std::string& path, bool* created) override {
    if (created != nullptr) *created = false;
    if (::mkdir(path.c_str(), options_.dir_mode) == 0) {
      if (created != nullptr) *created = true;
      // The umask may have narrowed it (a group mode).
      if (::chmod(path.c_str(), options_.dir_mode) != 0) return Errno("set the mode of directory", path, errno);
      return Status::Ok();
    }
    int err = errno;
    struct stat st {};
    if (err == EEXIST && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return Status::Ok();
    return Errno("create directory", path, err == EEXIST ? ENOTDIR : err);
  }

  Status SyncDir(const std::string& path) override {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) return Errno("open directory", path, errno);
    if (::fsync(fd.get()) != 0) return Errno("sync directory", path, errno);
    return Status::Ok();
  }

  Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return Errno("rename '" + from + "' to", to, errno);
    return Status::Ok();
  }

  Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return Errno("delete", path, errno);
    return Status::Ok();
  }

  Status DeleteDir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return Errno("delete directory", path, errno);
    return Status::Ok();
  }

  Status ListDir(const std::string& path, std::vector<std::string>* names) override {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return Errno("list directory", path, errno);
    names->clear();
    errno = 0;
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names->push_back(std::move(n));
    }
    int err = errno;
    ::closedir(d);
    if (err != 0) return Errno("list directory", path, err);
    return Status::Ok();
  }

  Status GetFileSize(const std::string& path, uint64_t* size) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return Errno("stat", path, errno);
    *size = static_cast<uint64_t>(st.st_size);
    return Status::Ok();
  }

  Status IsDirectory(const std::string& path, bool* is_dir) override {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return Errno("stat", path, errno);
    *is_dir = S_ISDIR(st.st_mode);
    return Status::Ok();
  }

  Status FreeSpace(const std::string& path, uint64_t* bytes) override {
    struct statvfs st {};
    if (::statvfs(path.c_str(), &st) != 0) return Errno("stat filesystem of", path, errno);
    *bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    return Status::Ok();
  }

 private:
  // Says once per process and kind of message how files are written.
  void LogOnce(const std::string& what) {
    std::string kind = what.substr(0, what.find('('));
    std::lock_guard<std::mutex> lock(mu_);
    if (logged_.insert(kind).second) FTRUN_LOG_INFO("persist: {}", what);
  }

  // Constant after construction
  const PosixEnvOptions options_;
  IoContextPool pool_;
  std::mutex mu_;
  std::set<std::string> logged_;  // Guarded by mu_
};

}  // namespace

Env* PosixEnv() {
  static Env* env = new PosixEnvImpl(PosixEnvOptions());
  return env;
}

std::unique_ptr<Env> NewPosixEnv(const PosixEnvOptions& options) {
  PosixEnvOptions o = options;
  if (o.queue_depth < 1) o.queue_depth = 1;
  if (o.queue_depth > 64) o.queue_depth = 64;
  if (o.buffer_size < kDirectAlign) o.buffer_size = kDirectAlign;
  o.buffer_size = o.buffer_size / kDirectAlign * kDirectAlign;
  return std::make_unique<PosixEnvImpl>(o);
}

uint32_t DirModeFor(uint32_t file_mode) {
  uint32_t m = file_mode | 0700;
  if (file_mode & 0040) m |= 0010;
  if (file_mode & 0004) m |= 0001;
  return m;
}

namespace {

std::string ModeString(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

// A directory another user could have made or replaced: ours, not a
// symlink, not writable by others (nor by the group when `group` is false).
Status CheckOwnDir(const std::string& path, bool group) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? Status::Ok() : Errno("inspect", path, errno);
  const uid_t me = ::geteuid();
  if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode) || st.st_uid != me ||
      (st.st_mode & (group ? S_IWOTH : (S_IWOTH | S_IWGRP)))) {
    return Status::FailedPrecondition("persist job directory '" + path + "' (in a directory any user can write) is " +
                                      (S_ISLNK(st.st_mode)    ? std::string("a symlink")
                                       : !S_ISDIR(st.st_mode) ? std::string("not a directory")
                                       : st.st_uid != me      ? "owned by uid " + std::to_string(st.st_uid) +
                                                               ", not this user (uid " + std::to_string(me) + ")"
                                                         : "writable by others (mode " + ModeString(st.st_mode) + ")") +
                                      ": another user may have made it; refusing to write the job's state there");
  }
  return Status::Ok();
}

}  // namespace

Status CheckPersistRoot(const std::string& dir, const std::string& job_id, uint32_t file_mode) {
  const bool group = (file_mode & 0060) != 0;
  std::string path = dir;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return Errno("inspect the persist directory", path, errno);
    // Created by the writer (one level, mode 0700): what matters is where.
    size_t slash = path.find_last_of('/');
    path = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    if (::lstat(path.c_str(), &st) != 0) return Errno("inspect the parent of the persist directory", path, errno);
    // A parent such as /tmp (anyone may write, sticky): the root is made
    // there; one another user made first is refused like a job directory.
    if (S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX)) return CheckOwnDir(dir, group);
  }
  const uid_t me = ::geteuid();
  if (S_ISLNK(st.st_mode)) {
    if (st.st_uid != me && st.st_uid != 0) {
      return Status::FailedPrecondition("persist directory '" + path + "' is a symlink owned by uid " +
                                        std::to_string(st.st_uid) + ", not this user (uid " + std::to_string(me) +
                                        "): refusing to write the job's state where another user points it");
    }
    if (::stat(path.c_str(), &st) != 0) return Errno("inspect the persist directory", path, errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::FailedPrecondition("persist directory '" + path + "' is not a directory");
  }
  const std::string mode = ModeString(st.st_mode);
  if ((st.st_mode & S_IWOTH) && (st.st_mode & S_ISVTX)) {
    // Like /tmp: others cannot remove or rename what is ours, but could
    // have made the job's directory.
    return path == dir ? CheckOwnDir(dir + "/" + job_id, group) : CheckOwnDir(dir, group);
  }
  if (st.st_mode & S_IWOTH) {
    return Status::FailedPrecondition("persist directory '" + path + "' (mode " + mode +
                                      ") can be written by any user: refusing to write the job's state there; "
                                      "use a directory of this user (chmod o-w)");
  }
  if (!group && st.st_uid != me && st.st_uid != 0) {
    return Status::FailedPrecondition("persist directory '" + path + "' is owned by uid " + std::to_string(st.st_uid) +
                                      ", not this user (uid " + std::to_string(me) +
                                      "); for a directory shared by a group set persist.file_mode to 0640 or 0660");
  }
  if (!group && (st.st_mode & S_IWGRP)) {
    return Status::FailedPrecondition("persist directory '" + path + "' (mode " + mode +
                                      ") can be written by its group: refusing with persist.file_mode 0600; "
                                      "chmod g-w it, or set persist.file_mode to 0660 for a group-shared directory");
  }
  return Status::Ok();
}

}  // namespace ftrun
