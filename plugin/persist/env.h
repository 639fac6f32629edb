// Env: every disk access of the persist layer (the lazy flusher, the disk
// reader, retention) goes through this seam, so tests can run the same code
// against FaultEnv, which drops unsynced data, fails writes and flips bits
// (LevelDB's env.h and fault_injection_test.cc).
//
// Conventions:
//  - Paths are plain strings; nothing here resolves or joins them.
//  - Every error Status names the path and, for a failed system call, has
//    strerror in it ("cannot create '/p/x.tmp': No space left on device").
//    A missing file or directory is kNotFound, everything else kIoError.
//  - Nothing is durable until synced: a file's bytes after WritableFile::
//    Sync, a new or renamed name after SyncDir of its directory.
//  - Env methods are thread-safe. A WritableFile or RandomAccessFile is used
//    by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

// How a WritableFile writes. PosixEnv uses O_DIRECT where the filesystem
// takes it and io_uring where the kernel allows it; FaultEnv reports the mode
// of the file it wraps.
struct WriteMode {
  bool direct = false;           // O_DIRECT, block-aligned buffers
  int queue_depth = 0;           // io_uring writes in flight; 0 = pwrite, one at a time
  std::string ToString() const;  // "O_DIRECT, io_uring qd 4" / "buffered, pwrite"
};

// A new file being written from the start. Appended bytes may sit in a buffer
// or be in flight until Sync or Close.
class WritableFile {
 public:
  virtual ~WritableFile() = default;  // closes without reporting errors; call Close
  // Appends n bytes (any alignment, any size). An error is sticky: every
  // later call fails with it.
  virtual Status Append(const void* data, size_t n) = 0;
  // Writes everything appended so far and makes it durable (fdatasync).
  virtual Status Sync() = 0;
  // Writes everything appended so far and closes the file, without syncing.
  // The file then holds exactly the appended bytes. Calling it twice is fine.
  virtual Status Close() = 0;
  virtual WriteMode mode() const = 0;
  virtual const std::string& path() const = 0;
};

// A file opened for positional reads.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads up to n bytes at offset into dst; *got is less than n only at the
  // end of the file.
  virtual Status Read(uint64_t offset, size_t n, void* dst, size_t* got) const = 0;
  virtual uint64_t size() const = 0;  // the size when the file was opened
  virtual const std::string& path() const = 0;
};

class Env {
 public:
  virtual ~Env() = default;

  // Creates `path`, or truncates it if it exists.
  virtual Status NewWritableFile(const std::string& path, std::unique_ptr<WritableFile>* out) = 0;
  virtual Status NewRandomAccessFile(const std::string& path, std::unique_ptr<RandomAccessFile>* out) = 0;
  // Reads a whole (small) file: manifests, markers.
  virtual Status ReadFile(const std::string& path, std::string* out);

  // Creates one directory level. An existing directory is fine; *created (if
  // given) says whether this call made it.
  virtual Status CreateDir(const std::string& path, bool* created = nullptr) = 0;
  // Makes the names created, renamed or deleted in `path` durable.
  virtual Status SyncDir(const std::string& path) = 0;
  // Atomically replaces `to` (if it exists) with `from`.
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual Status DeleteFile(const std::string& path) = 0;
  virtual Status DeleteDir(const std::string& path) = 0;  // must be empty
  // Names in a directory, without "." and "..", in no particular order.
  virtual Status ListDir(const std::string& path, std::vector<std::string>* names) = 0;
  // kNotFound when the file does not exist.
  virtual Status GetFileSize(const std::string& path, uint64_t* size) = 0;
  virtual Status IsDirectory(const std::string& path, bool* is_dir) = 0;
  bool FileExists(const std::string& path);
  // Bytes free for an unprivileged writer on the filesystem of `path`.
  virtual Status FreeSpace(const std::string& path, uint64_t* bytes);
};

struct PosixEnvOptions {
  bool direct_io = true;          // try O_DIRECT; fall back to buffered where refused
  bool io_uring = true;           // try io_uring; fall back to pwrite where refused
  int queue_depth = 4;            // io_uring writes in flight per file, 1..64
  size_t buffer_size = 1u << 20;  // bytes per write; a multiple of 4096
  // Tests only: make O_DIRECT fail with EINVAL as on a filesystem without
  // direct I/O, at open (kAtOpen) or at the first write (kAtWrite, as some
  // FUSE filesystems do). This kernel's tmpfs accepts O_DIRECT.
  enum class RefuseDirect { kNo, kAtOpen, kAtWrite } refuse_direct = RefuseDirect::kNo;
  // Modes of what it creates, set explicitly (fchmod/chmod: the umask does
  // not narrow or widen them): the job's user only, by default
  // (persist.file_mode widens them for a group).
  uint32_t file_mode = 0600;
  uint32_t dir_mode = 0700;
};

// The directory mode that goes with a file mode: x where r is set (0600 ->
// 0700, 0640 -> 0750, 0660 -> 0770).
uint32_t DirModeFor(uint32_t file_mode);

// Before ftrun creates anything in the persist root `dir` (which may not
// exist yet: then its parent is checked): refused, naming the path and what
// is wrong, when it is a symlink owned by another user, or (following it) a
// directory that others can write, or, with a private file_mode (no group
// bits), one that another user owns or its group can write. A group
// file_mode accepts a group-writable root owned by another user of the
// group (a shared directory). A root that anyone can write but with the
// sticky bit (/tmp, a fresh tmpfs) is accepted, and then the job's
// directory in it (`job_id`), if it exists already, must be this user's, not
// a symlink and not writable by others: another user could have made it.
Status CheckPersistRoot(const std::string& dir, const std::string& job_id, uint32_t file_mode);

// The process-wide POSIX Env with default options. Never deleted.
Env* PosixEnv();
std::unique_ptr<Env> NewPosixEnv(const PosixEnvOptions& options);

// Removes a directory tree through `env` (files, then directories). A missing
// `path` is fine.
Status DeleteTree(Env* env, const std::string& path);

}  // namespace ftrun
