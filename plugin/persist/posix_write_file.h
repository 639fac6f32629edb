// PosixEnv's WritableFile, internal to posix_env.cc: appends are copied into
// block-aligned buffers of PosixEnvOptions::buffer_size and written with
// O_DIRECT where the file was opened with it, several at a time through
// io_uring where the kernel allows it, else one at a time with pwrite.
//
// Zero copy: under O_DIRECT, an Append whose source is block-aligned, made
// while nothing is buffered, writes its aligned part straight from the
// caller's memory (pieces of up to 4 MiB, queue_depth x buffer_size bytes
// at a time) and waits for those writes before it returns, so the caller's
// bytes are never copied and never referenced after Append. That is how the
// persist writer writes chunks from the agent's page-aligned arena: a bounce
// copy costs a core ~0.1 s per GiB, which the training ranks on the same
// node would feel.
//
// The unaligned tail under O_DIRECT is written padded to the block size and
// the file is then cut to its real size with ftruncate; the partial block
// stays buffered, so a later Append rewrites it whole. A filesystem that
// takes O_DIRECT at open but refuses the first write (EINVAL) gets the file
// switched to buffered writes, once, before any direct write succeeded.
//
// Buffers and rings are expensive to set up (fresh memory is touched at
// ~1 GB/s), so files borrow them from an IoContextPool and give them back at
// Close, or as soon as they are idle (nothing buffered, nothing in flight);
// a later Append takes them again. So a file kept open between its writes
// and its Sync holds only its descriptor. Nothing is returned to the pool
// while a write is in flight.
#pragma once

#include <liburing.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "plugin/common/fd.h"
#include "plugin/persist/env.h"

namespace ftrun {

inline constexpr size_t kDirectAlign = 4096;

// One file's write resources: queue_depth aligned buffers and a ring.
struct IoContext {
  IoContext(int queue_depth, size_t buffer_size, bool want_ring);
  ~IoContext();
  IoContext(const IoContext&) = delete;
  IoContext& operator=(const IoContext&) = delete;
  void DropRing();  // after io_uring failed at run time; only with nothing in flight

  std::vector<char*> buffers;
  size_t buffer_size;
  bool has_ring = false;
  int ring_error = 0;  // errno of a failed io_uring_queue_init
  io_uring ring{};
};

// Thread-safe. Keeps a few idle contexts for reuse.
class IoContextPool {
 public:
  IoContextPool(int queue_depth, size_t buffer_size, bool want_ring)
      : queue_depth_(queue_depth), buffer_size_(buffer_size), want_ring_(want_ring) {}
  std::unique_ptr<IoContext> Get();
  void Put(std::unique_ptr<IoContext> ctx);

 private:
  // Constant after construction
  const int queue_depth_;
  const size_t buffer_size_;
  const bool want_ring_;
  std::mutex mu_;
  std::vector<std::unique_ptr<IoContext>> idle_;  // Guarded by mu_
};

class PosixWriteFile : public WritableFile {
 public:
  // fd is open for writing, with O_DIRECT when `direct`. fake_einval: tests,
  // the first direct write fails with EINVAL without being issued.
  PosixWriteFile(std::string path, UniqueFd fd, bool direct, bool fake_einval, IoContextPool* pool);
  ~PosixWriteFile() override;

  Status Append(const void* data, size_t n) override;
  Status Sync() override;
  Status Close() override;
  WriteMode mode() const override;
  const std::string& path() const override { return path_; }

 private:
  void EnsureContext();                              // takes a context from the pool if the file has none
  void ReleaseIfIdle();                              // gives it back when nothing is buffered or in flight
  Status AppendFromCaller(const char* p, size_t n);  // zero copy, see above
  int AcquireSlot(Status* st);
  Status Issue(int slot, uint64_t offset, size_t len);
  Status Complete(int slot, ssize_t res);
  // A write of buf[0, len) at off ended with res (bytes or -errno): finishes
  // a short write, falls back to buffered on a first EINVAL.
  Status CompleteWrite(const char* buf, uint64_t off, size_t len, ssize_t res);
  Status ReapOne(bool* stuck);  // *stuck: the ring could not be waited on
  Status Drain();
  Status WriteTail();
  int PwriteAll(const char* p, size_t len, uint64_t offset);  // 0 or errno
  Status FallBackToBuffered();
  Status Fail(Status st);
  void Release();

  const std::string path_;
  UniqueFd fd_;
  const bool opened_direct_;
  bool direct_;
  bool direct_ok_ = false;  // a direct write has succeeded: EINVAL is then an error
  bool fake_einval_;
  IoContextPool* pool_;
  std::unique_ptr<IoContext> ctx_;  // nullptr while idle (ReleaseIfIdle)
  std::vector<bool> busy_;
  std::vector<uint64_t> slot_offset_;
  std::vector<size_t> slot_len_;
  int in_flight_ = 0;
  int queue_depth_ = 0;     // 0 = pwrite
  int cur_ = -1;            // slot being filled, -1 = none
  size_t fill_ = 0;         // bytes in cur_
  uint64_t offset_ = 0;     // file offset of cur_'s first byte (aligned)
  bool tail_clean_ = true;  // the bytes in cur_ are on the file as they are
  bool closed_ = false;
  Status error_;  // sticky
};

}  // namespace ftrun
