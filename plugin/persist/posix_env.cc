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
                                                     : ::open(path.c_str(), base | O_DIRECT, 0644);
      direct = fd >= 0;
      if (fd < 0 && errno != EINVAL) return Errno("create", path, errno);
      if (fd < 0) LogOnce("O_DIRECT refused at open (" + path + "); writing buffered");
    }
    if (fd < 0) {
      fd = ::open(path.c_str(), base, 0644);
      if (fd < 0) return Errno("create", path, errno);
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
    if (::mkdir(path.c_str(), 0755) == 0) {
      if (created != nullptr) *created = true;
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

}  // namespace ftrun
