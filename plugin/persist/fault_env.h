// FaultEnv: an Env for tests that wraps another one and injects the faults a
// disk writer must survive (LevelDB's db/fault_injection_test.cc):
//
//  - Crashes. CrashAfter(n) lets n more mutating calls through and fails
//    every later one, as if the process died there; Crash() then undoes what
//    a power loss would lose: bytes appended since the file's last Sync,
//    files and directories whose names no SyncDir of their parent made
//    durable, and renames likewise (the old name comes back, with the bytes
//    it had; an overwritten target gets its old bytes back).
//  - Write errors: ENOSPC or EIO after a number of bytes, or with a seeded
//    probability, switchable at any time (FailWrites / ClearWriteFaults).
//    They hit Append (a short write first, as a full disk does), Sync,
//    NewWritableFile, CreateDir and RenameFile. Deletes always work: that is
//    how space comes back.
//  - Read errors: the next N reads of files whose path contains a given
//    part fail with an errno (EIO by default), as a flaky disk does; the
//    error is classified as disk_errors.h says (EIO: transient).
//  - Bit flips, in what reads return (FlipBitOnRead) or in the file itself
//    (FlipBitOnDisk).
//
// Deletes are durable at once (not undone by Crash). Files and names that
// existed before they were first touched through this FaultEnv count as
// durable. Thread-safe: one mutex around everything.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "plugin/persist/env.h"

namespace ftrun {

struct WriteFault {
  int err = 28;              // errno to fail with: ENOSPC (28) or EIO (5)
  uint64_t after_bytes = 0;  // appends succeed for this many more bytes first
  double probability = 1.0;  // then each write call fails with this probability
  uint64_t seed = 1;
};

class FaultEnv : public Env {
 public:
  explicit FaultEnv(Env* base) : base_(base) {}

  Status NewWritableFile(const std::string& path, std::unique_ptr<WritableFile>* out) override;
  Status NewRandomAccessFile(const std::string& path, std::unique_ptr<RandomAccessFile>* out) override;
  Status CreateDir(const std::string& path, bool* created = nullptr) override;
  Status SyncDir(const std::string& path) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status DeleteFile(const std::string& path) override;
  Status DeleteDir(const std::string& path) override;
  Status ListDir(const std::string& path, std::vector<std::string>* names) override;
  Status GetFileSize(const std::string& path, uint64_t* size) override;
  Status IsDirectory(const std::string& path, bool* is_dir) override;
  Status FreeSpace(const std::string& path, uint64_t* bytes) override;

  // Crashes.
  void CrashAfter(uint64_t ops);
  uint64_t ops() const;  // mutating calls let through so far
  bool crashed() const;  // the CrashAfter point was reached
  Status Crash();        // drop what was not durable; the env works again

  // Write errors.
  void FailWrites(const WriteFault& fault);
  void ClearWriteFaults();
  uint64_t failed_writes() const;

  // Read errors: the next `count` RandomAccessFile reads (ReadFile too) of
  // files whose path contains `path_part` ("" = any) fail with errno `err`.
  void FailReads(int err, uint64_t count, std::string path_part = "");
  uint64_t failed_reads() const;

  // Bit flips. `bit` is 0..7 of the byte at `offset`.
  void FlipBitOnRead(const std::string& path, uint64_t offset, int bit);
  void ClearReadFlips();
  Status FlipBitOnDisk(const std::string& path, uint64_t offset, int bit);

 private:
  class Writable;
  class Readable;
  friend class Writable;
  friend class Readable;
  struct FileState {
    uint64_t size = 0;
    uint64_t synced = 0;
  };

  // All Locked* helpers run with mu_ held.
  Status LockedEnter(const std::string& what, const std::string& path);  // counts an op, fails after a crash
  Status LockedWriteFault(const std::string& what, const std::string& path, size_t n, size_t* allowed);
  void LockedNewName(const std::string& path);
  bool LockedNameIsNew(const std::string& path) const;
  void LockedStash(const std::string& path);
  void LockedForget(const std::string& path);
  Status LockedTruncate(const std::string& path, uint64_t size);

  Env* const base_;  // Constant after construction

  mutable std::mutex mu_;
  uint64_t ops_ = 0;                                        // Guarded by mu_
  uint64_t crash_at_ = UINT64_MAX;                          // Guarded by mu_
  bool crashed_ = false;                                    // Guarded by mu_
  std::map<std::string, FileState> files_;                  // Guarded by mu_: written since the last Crash
  std::map<std::string, std::set<std::string>> new_names_;  // Guarded by mu_: dir -> names not yet durable
  std::map<std::string, std::string> stash_;                // Guarded by mu_: path -> durable bytes to restore
  bool fault_armed_ = false;                                // Guarded by mu_
  WriteFault fault_;                                        // Guarded by mu_
  uint64_t fault_budget_ = 0;                               // Guarded by mu_
  std::mt19937_64 rng_;                                     // Guarded by mu_
  uint64_t failed_writes_ = 0;                              // Guarded by mu_
  std::map<std::string, std::vector<std::pair<uint64_t, int>>> read_flips_;  // Guarded by mu_
  int read_err_ = 0;                                                         // Guarded by mu_
  mutable uint64_t read_faults_left_ = 0;                                    // Guarded by mu_
  std::string read_fault_part_;                                              // Guarded by mu_
  mutable uint64_t failed_reads_ = 0;                                        // Guarded by mu_
};

}  // namespace ftrun
