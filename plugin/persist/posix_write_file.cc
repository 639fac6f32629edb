// Large aligned writes for PosixEnv: O_DIRECT and io_uring where allowed.
#include "plugin/persist/posix_write_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "plugin/common/check.h"
#include "plugin/common/log.h"

namespace ftrun {

IoContext::IoContext(int queue_depth, size_t size, bool want_ring) : buffer_size(size) {
  for (int i = 0; i < queue_depth; ++i) {
    void* p = nullptr;
    FTRUN_CHECK(posix_memalign(&p, kDirectAlign, size) == 0);
    buffers.push_back(static_cast<char*>(p));
  }
  if (want_ring) {
    int rc = io_uring_queue_init(static_cast<unsigned>(queue_depth), &ring, 0);
    has_ring = rc == 0;
    ring_error = rc < 0 ? -rc : 0;
  }
}

IoContext::~IoContext() {
  DropRing();
  for (char* b : buffers) std::free(b);
}

void IoContext::DropRing() {
  if (has_ring) io_uring_queue_exit(&ring);
  has_ring = false;
}

std::unique_ptr<IoContext> IoContextPool::Get() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      auto ctx = std::move(idle_.back());
      idle_.pop_back();
      return ctx;
    }
  }
  auto ctx = std::make_unique<IoContext>(queue_depth_, buffer_size_, want_ring_);
  if (want_ring_ && !ctx->has_ring) {
    static std::once_flag once;
    std::call_once(once, [&] {
      FTRUN_LOG_WARN("persist: io_uring unavailable ({}); writing with pwrite", std::strerror(ctx->ring_error));
    });
  }
  return ctx;
}

void IoContextPool::Put(std::unique_ptr<IoContext> ctx) {
  constexpr size_t kMaxIdle = 8;  // one per flusher I/O thread
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < kMaxIdle) idle_.push_back(std::move(ctx));
}

PosixWriteFile::PosixWriteFile(std::string path, UniqueFd fd, bool direct, bool fake_einval, IoContextPool* pool)
    : path_(std::move(path)),
      fd_(std::move(fd)),
      opened_direct_(direct),
      direct_(direct),
      fake_einval_(fake_einval),
      pool_(pool) {
  EnsureContext();
}

void PosixWriteFile::EnsureContext() {
  if (ctx_) return;
  ctx_ = pool_->Get();
  size_t n = ctx_->buffers.size();
  queue_depth_ = ctx_->has_ring ? static_cast<int>(n) : 0;
  busy_.assign(n, false);
  slot_offset_.assign(n, 0);
  slot_len_.assign(n, 0);
}

void PosixWriteFile::ReleaseIfIdle() {
  if (ctx_ && cur_ < 0 && in_flight_ == 0) pool_->Put(std::move(ctx_));
}

PosixWriteFile::~PosixWriteFile() {
  if (!closed_) {
    (void)Drain();  // the kernel may still read our buffers
    Release();
  }
}

WriteMode PosixWriteFile::mode() const { return WriteMode{direct_, queue_depth_}; }

Status PosixWriteFile::Fail(Status st) {
  if (error_.ok()) error_ = std::move(st);
  return error_;
}

void PosixWriteFile::Release() {
  // With writes still in flight (the ring could not be waited on) the
  // buffers are leaked rather than reused or freed under the kernel.
  if (in_flight_ > 0) (void)ctx_.release();
  if (ctx_) pool_->Put(std::move(ctx_));
  fd_.Reset();
}

Status PosixWriteFile::Append(const void* data, size_t n) {
  if (!error_.ok()) return error_;
  if (closed_) return Fail(Status::IoError("cannot append to '" + path_ + "': the file is closed"));
  EnsureContext();
  const char* p = static_cast<const char*>(data);
  if (direct_ && cur_ < 0 && n >= kDirectAlign && reinterpret_cast<uintptr_t>(p) % kDirectAlign == 0) {
    const size_t k = n / kDirectAlign * kDirectAlign;
    Status st = AppendFromCaller(p, k);
    if (!st.ok()) return Fail(st);
    p += k;
    n -= k;
  }
  while (n > 0) {
    if (cur_ < 0) {
      Status st;
      cur_ = AcquireSlot(&st);
      if (!st.ok()) return Fail(st);
      fill_ = 0;
    }
    size_t k = std::min(n, ctx_->buffer_size - fill_);
    std::memcpy(ctx_->buffers[cur_] + fill_, p, k);
    fill_ += k;
    p += k;
    n -= k;
    tail_clean_ = false;
    if (fill_ == ctx_->buffer_size) {
      int slot = std::exchange(cur_, -1);
      uint64_t off = offset_;
      offset_ += fill_;
      fill_ = 0;
      FTRUN_RETURN_IF_ERROR(Issue(slot, off, ctx_->buffer_size));
    }
  }
  ReleaseIfIdle();
  return Status::Ok();
}

// p is aligned, n a multiple of the block size, nothing is buffered (cur_ <
// 0), so offset_ is aligned too. Returns only once no write of p[0, n) is in
// flight, unless the ring cannot be waited on (then the file fails and the
// ring is never reused; the kernel keeps the pages it writes pinned).
Status PosixWriteFile::AppendFromCaller(const char* p, size_t n) {
  FTRUN_RETURN_IF_ERROR(Drain());  // buffered writes still in flight: their slots and ring entries
  const uint64_t base = offset_;
  if (!ctx_->has_ring || (direct_ && fake_einval_ && !direct_ok_)) {
    ssize_t res = static_cast<ssize_t>(n);
    if (direct_ && fake_einval_ && !direct_ok_) {
      res = -EINVAL;
    } else if (int err = PwriteAll(p, n, base); err != 0) {
      res = -err;
    }
    FTRUN_RETURN_IF_ERROR(CompleteWrite(p, base, n, res));
    offset_ = base + n;
    return Status::Ok();
  }
  // As many bytes in flight as copied writes have (queue_depth x
  // buffer_size), in pieces of up to 4 MiB: fewer, larger requests cost less
  // CPU per byte (on a VM each submission traps to the hypervisor).
  constexpr size_t kMaxPiece = 4u << 20;
  const size_t window = ctx_->buffer_size * ctx_->buffers.size();
  const size_t piece = std::max(ctx_->buffer_size, std::min(kMaxPiece, window) / kDirectAlign * kDirectAlign);
  struct Piece {
    size_t at = 0, len = 0;
    bool busy = false;
  };
  std::vector<Piece> pieces(std::max<size_t>(1, window / piece));  // <= queue_depth: the ring has room
  size_t issued = 0;
  int pending = 0;
  bool ring_ok = true;
  Status st;
  while ((st.ok() && ring_ok && issued < n) || pending > 0) {
    while (st.ok() && ring_ok && issued < n && pending < static_cast<int>(pieces.size())) {
      size_t slot = 0;
      while (pieces[slot].busy) ++slot;
      const size_t len = std::min(piece, n - issued);
      io_uring_sqe* sqe = io_uring_get_sqe(&ctx_->ring);
      FTRUN_CHECK(sqe != nullptr);  // never more writes than ring entries
      io_uring_prep_write(sqe, fd_.get(), p + issued, static_cast<unsigned>(len), base + issued);
      io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot));
      int rc = io_uring_submit(&ctx_->ring);
      if (rc != 1) {  // refused at run time: reap what is in flight, then pwrite
        FTRUN_LOG_WARN("persist: io_uring_submit on '{}' failed ({}); writing with pwrite", path_,
                       std::strerror(rc < 0 ? -rc : EAGAIN));
        ring_ok = false;
        break;
      }
      pieces[slot] = {issued, len, true};
      ++pending;
      issued += len;
    }
    if (pending == 0) break;
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = io_uring_wait_cqe(&ctx_->ring, &cqe);
    } while (rc == -EINTR);
    if (rc < 0) {
      in_flight_ += pending;  // Release leaks the context rather than reuse its ring
      return Fail(Status::FromErrno("cannot wait for writes to '" + path_ + "'", -rc));
    }
    const size_t slot = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
    const ssize_t res = cqe->res;
    io_uring_cqe_seen(&ctx_->ring, cqe);
    --pending;
    pieces[slot].busy = false;
    Status done = CompleteWrite(p + pieces[slot].at, base + pieces[slot].at, pieces[slot].len, res);
    if (!done.ok() && st.ok()) st = done;
  }
  if (!ring_ok) {  // never reuse a ring that may hold an unsubmitted entry
    ctx_->DropRing();
    queue_depth_ = 0;
  }
  FTRUN_RETURN_IF_ERROR(st);
  if (!ring_ok) {
    if (issued < n) {
      int err = PwriteAll(p + issued, n - issued, base + issued);
      FTRUN_RETURN_IF_ERROR(
          CompleteWrite(p + issued, base + issued, n - issued, err != 0 ? -err : static_cast<ssize_t>(n - issued)));
    }
  }
  offset_ = base + n;
  return Status::Ok();
}

int PosixWriteFile::AcquireSlot(Status* st) {
  for (;;) {
    for (size_t i = 0; i < busy_.size(); ++i) {
      if (!busy_[i] && static_cast<int>(i) != cur_) return static_cast<int>(i);
    }
    *st = ReapOne(nullptr);
    if (!st->ok()) return -1;
  }
}

Status PosixWriteFile::Issue(int slot, uint64_t offset, size_t len) {
  busy_[slot] = true;
  slot_offset_[slot] = offset;
  slot_len_[slot] = len;
  if (direct_ && fake_einval_ && !direct_ok_) return Complete(slot, -EINVAL);
  if (ctx_->has_ring) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ctx_->ring);
    FTRUN_CHECK(sqe != nullptr);  // never more writes than ring entries
    io_uring_prep_write(sqe, fd_.get(), ctx_->buffers[slot], static_cast<unsigned>(len), offset);
    io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot));
    int rc = io_uring_submit(&ctx_->ring);
    if (rc == 1) {
      ++in_flight_;
      return Status::Ok();
    }
    // io_uring refused at run time (e.g. a seccomp filter): pwrite from now
    // on. Nothing is in flight when the very first submit fails.
    FTRUN_LOG_WARN("persist: io_uring_submit on '{}' failed ({}); writing with pwrite", path_,
                   std::strerror(rc < 0 ? -rc : EAGAIN));
    Status drained = Drain();
    ctx_->DropRing();  // even after a failed Drain: the ring may hold the unsubmitted entry
    queue_depth_ = 0;
    FTRUN_RETURN_IF_ERROR(drained);
  }
  int err = PwriteAll(ctx_->buffers[slot], len, offset);
  return Complete(slot, err != 0 ? -err : static_cast<ssize_t>(len));
}

Status PosixWriteFile::Complete(int slot, ssize_t res) {
  busy_[slot] = false;
  return CompleteWrite(ctx_->buffers[slot], slot_offset_[slot], slot_len_[slot], res);
}

Status PosixWriteFile::CompleteWrite(const char* buf, uint64_t off, size_t len, ssize_t res) {
  if (res == -EINVAL && opened_direct_ && !direct_ok_) {
    // Every write in flight at the switch fails the same way; redo each.
    if (direct_) FTRUN_RETURN_IF_ERROR(FallBackToBuffered());
    res = -PwriteAll(buf, len, off);
    if (res == 0) return Status::Ok();
  } else if (res >= 0 && static_cast<size_t>(res) < len) {  // short write: finish it here
    int err = PwriteAll(buf + res, len - res, off + res);
    res = err != 0 ? -err : static_cast<ssize_t>(len);
  }
  if (res < 0) {
    return Fail(Status::FromErrno(
        "cannot write " + std::to_string(len) + " bytes at offset " + std::to_string(off) + " of '" + path_ + "'",
        static_cast<int>(-res)));
  }
  if (direct_) direct_ok_ = true;
  return Status::Ok();
}

Status PosixWriteFile::FallBackToBuffered() {
  int flags = fcntl(fd_.get(), F_GETFL);
  if (flags < 0 || fcntl(fd_.get(), F_SETFL, flags & ~O_DIRECT) < 0) {
    return Fail(Status::FromErrno("cannot turn off O_DIRECT on '" + path_ + "'", errno));
  }
  direct_ = false;
  static std::once_flag once;
  std::call_once(once, [&] {
    FTRUN_LOG_INFO("persist: the filesystem of '{}' refused an O_DIRECT write; writing buffered", path_);
  });
  return Status::Ok();
}

int PosixWriteFile::PwriteAll(const char* p, size_t len, uint64_t offset) {
  while (len > 0) {
    ssize_t n = ::pwrite(fd_.get(), p, len, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;  // no progress: never loop forever
    p += n;
    len -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return 0;
}

Status PosixWriteFile::ReapOne(bool* stuck) {
  FTRUN_CHECK(in_flight_ > 0);
  io_uring_cqe* cqe = nullptr;
  int rc;
  do {
    rc = io_uring_wait_cqe(&ctx_->ring, &cqe);
  } while (rc == -EINTR);
  if (rc < 0) {
    if (stuck != nullptr) *stuck = true;
    return Fail(Status::FromErrno("cannot wait for writes to '" + path_ + "'", -rc));
  }
  int slot = static_cast<int>(io_uring_cqe_get_data64(cqe));
  ssize_t res = cqe->res;
  io_uring_cqe_seen(&ctx_->ring, cqe);
  --in_flight_;
  return Complete(slot, res);
}

Status PosixWriteFile::Drain() {
  Status first;
  bool stuck = false;
  while (in_flight_ > 0 && !stuck) {
    Status st = ReapOne(&stuck);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

Status PosixWriteFile::WriteTail() {
  FTRUN_RETURN_IF_ERROR(Drain());
  if (cur_ < 0 || tail_clean_) return Status::Ok();
  size_t len = fill_;
  bool padded = false;
  if (direct_) {
    len = (fill_ + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    std::memset(ctx_->buffers[cur_] + fill_, 0, len - fill_);
    padded = len != fill_;
  }
  // Issue without the ring: the tail is one write, waited for at once. The
  // partial block stays in cur_ so that a later Append rewrites it whole.
  busy_[cur_] = true;
  slot_offset_[cur_] = offset_;
  slot_len_[cur_] = len;
  ssize_t res = static_cast<ssize_t>(len);
  if (direct_ && fake_einval_ && !direct_ok_) {
    res = -EINVAL;
  } else if (int err = PwriteAll(ctx_->buffers[cur_], len, offset_); err != 0) {
    res = -err;
  }
  FTRUN_RETURN_IF_ERROR(Complete(cur_, res));
  if (padded && ::ftruncate(fd_.get(), static_cast<off_t>(offset_ + fill_)) != 0) {
    return Fail(
        Status::FromErrno("cannot cut '" + path_ + "' to " + std::to_string(offset_ + fill_) + " bytes", errno));
  }
  tail_clean_ = true;
  return Status::Ok();
}

Status PosixWriteFile::Sync() {
  if (!error_.ok()) return error_;
  if (closed_) return Fail(Status::IoError("cannot sync '" + path_ + "': the file is closed"));
  FTRUN_RETURN_IF_ERROR(WriteTail());
  if (::fdatasync(fd_.get()) != 0) return Fail(Status::FromErrno("cannot sync '" + path_ + "'", errno));
  return Status::Ok();
}

Status PosixWriteFile::Close() {
  if (closed_) return error_;
  Status st = error_.ok() ? WriteTail() : Drain();
  closed_ = true;
  int fd = fd_.Release();
  if (::close(fd) != 0 && st.ok()) st = Status::FromErrno("cannot close '" + path_ + "'", errno);
  Release();
  if (!st.ok()) return Fail(st);
  return error_;
}

}  // namespace ftrun
