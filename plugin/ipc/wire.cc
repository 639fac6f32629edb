#include "plugin/ipc/wire.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "plugin/common/bytes.h"

namespace ftrun {
namespace {
constexpr int kSendStallMs = 5000;
}  // namespace

ssize_t SendMsgWithFd(int sock, iovec* iov, size_t iovcnt, int pass_fd, int flags) {
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = iovcnt;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (pass_fd >= 0) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
  }
  return ::sendmsg(sock, &msg, flags | MSG_NOSIGNAL);
}

Status SendFrame(int fd, MsgType type, std::string_view payload, int pass_fd) {
  if (payload.size() > kMaxFrameBytes) return Status::InvalidArgument("message too large");
  FrameHeader h{kFrameMagic, static_cast<uint16_t>(type), 0, static_cast<uint32_t>(payload.size())};
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(payload.data()), payload.size()}};
  size_t total = sizeof(h) + payload.size();
  size_t sent = 0;
  bool fd_sent = pass_fd < 0;
  while (sent < total) {
    // Rebuild the iovec from `sent` onwards.
    iovec cur[2];
    int n = 0;
    if (sent < sizeof(h)) {
      cur[n++] = {reinterpret_cast<char*>(&h) + sent, sizeof(h) - sent};
      if (!payload.empty()) cur[n++] = iov[1];
    } else {
      size_t p = sent - sizeof(h);
      cur[n++] = {const_cast<char*>(payload.data()) + p, payload.size() - p};
    }
    ssize_t w = SendMsgWithFd(fd, cur, static_cast<size_t>(n), fd_sent ? -1 : pass_fd, 0);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        // A peer that stopped reading (e.g. a SIGSTOPped rank) must not
        // wedge the agent's loop: give up after kSendStallMs.
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, kSendStallMs) == 0) {
          return Status::Timeout("peer did not read for " + std::to_string(kSendStallMs) + " ms");
        }
        continue;
      }
      if (errno == EPIPE || errno == ECONNRESET) return Status::Unavailable("agent connection closed");
      return Status::FromErrno("sendmsg", errno);
    }
    fd_sent = true;
    sent += static_cast<size_t>(w);
  }
  return Status::Ok();
}

namespace {

Status RecvExact(int fd, char* buf, size_t n, int timeout_ms, UniqueFd* received_fd) {
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  size_t got = 0;
  while (got < n) {
    if (timeout_ms >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return Status::Timeout("no reply from the agent within " + std::to_string(timeout_ms) + " ms");
      pollfd p{fd, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(left));
      if (r < 0 && errno != EINTR) return Status::FromErrno("poll", errno);
      if (r <= 0) continue;
    }
    iovec iov{buf + got, n - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t r = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ECONNRESET) return Status::Unavailable("agent connection reset");
      return Status::FromErrno("recvmsg", errno);
    }
    if (r == 0) return Status::Unavailable("agent closed the connection");
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
        int passed;
        std::memcpy(&passed, CMSG_DATA(cm), sizeof(int));
        if (received_fd != nullptr)
          received_fd->Reset(passed);
        else
          ::close(passed);
      }
    }
    got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

}  // namespace

Status RecvFrame(int fd, int timeout_ms, MsgType* type, std::string* payload, UniqueFd* received_fd) {
  FrameHeader h;
  FTRUN_RETURN_IF_ERROR(RecvExact(fd, reinterpret_cast<char*>(&h), sizeof(h), timeout_ms, received_fd));
  if (h.magic != kFrameMagic || h.length > kMaxFrameBytes) {
    return Status::Corruption("bad frame from the agent (magic or length): protocol mismatch");
  }
  payload->resize(h.length);
  if (h.length > 0) FTRUN_RETURN_IF_ERROR(RecvExact(fd, payload->data(), h.length, timeout_ms, received_fd));
  *type = static_cast<MsgType>(h.type);
  return Status::Ok();
}

Status FrameReader::ReadFrom(int fd, size_t budget) {
  char tmp[64 * 1024];
  size_t taken = 0;
  while (taken < budget) {
    iovec iov{tmp, std::min(sizeof(tmp), budget - taken)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t r = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
      if (errno == ECONNRESET) return Status::Unavailable("connection reset");
      return Status::FromErrno("recvmsg", errno);
    }
    // The kernel ends a read with the message that carried descriptors, and
    // a sender attaches them to the first bytes of a frame (one sendmsg per
    // frame, split or not): the last byte read is that frame's.
    const uint64_t at = base_ + buf_.size() + static_cast<uint64_t>(r > 0 ? r - 1 : 0);
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int passed;
        std::memcpy(&passed, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        UniqueFd owned(passed);
        if (accept_fds_ && fds_.size() < kMaxPendingFds)
          fds_.push_back({at, std::move(owned)});
        else if (accept_fds_)
          return Status::ResourceExhausted("peer passed more than " + std::to_string(kMaxPendingFds) + " descriptors");
      }
    }
    if (r == 0) return Status::Unavailable("peer closed the connection");
    buf_.append(tmp, static_cast<size_t>(r));
    taken += static_cast<size_t>(r);
  }
  return Status::Ok();
}

bool FrameReader::Next(MsgType* type, std::string* payload, UniqueFd* fd) {
  if (!status_.ok() || buf_.size() - pos_ < sizeof(FrameHeader)) return false;
  FrameHeader h;
  std::memcpy(&h, buf_.data() + pos_, sizeof(h));
  if (h.magic != kFrameMagic) {
    status_ = Status::Corruption("bad frame magic: not an ftrun client");
    return false;
  }
  if (h.length > max_frame_) {
    status_ = Status::InvalidArgument("a " + std::to_string(h.length) + "-byte frame (type " + std::to_string(h.type) +
                                      ") is over the " + std::to_string(max_frame_) + "-byte limit");
    return false;
  }
  if (buf_.size() - pos_ - sizeof(h) < h.length) return false;
  *type = static_cast<MsgType>(h.type);
  payload->assign(buf_, pos_ + sizeof(h), h.length);
  const uint64_t start = base_ + pos_, end = start + sizeof(h) + h.length;
  // A descriptor belongs to the frame whose bytes it came with.
  while (!fds_.empty() && fds_.front().at < end) {
    if (fd != nullptr && fds_.front().at >= start && !fd->valid()) *fd = std::move(fds_.front().fd);
    fds_.erase(fds_.begin());
  }
  pos_ += sizeof(h) + h.length;
  if (pos_ == buf_.size()) {
    base_ += pos_;
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > (1u << 20)) {
    base_ += pos_;
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  return true;
}

std::string EncodeError(const Status& s) {
  ByteWriter w;
  w.Put<uint32_t>(static_cast<uint32_t>(s.code()));
  w.PutString(s.message());
  return w.Take();
}

Status DecodeError(std::string_view payload) {
  ByteReader r(payload);
  auto code = static_cast<Code>(r.Get<uint32_t>());
  std::string msg = r.GetString();
  if (!r.ok()) return Status::Corruption("malformed error message from the agent");
  return Status(code, msg);
}

std::string EncodeSaveStall(uint64_t version, double seconds) {
  ByteWriter w;
  w.Put<uint64_t>(version);
  w.Put<uint64_t>(seconds > 0 ? static_cast<uint64_t>(seconds * 1e9) : 0);
  return w.Take();
}

Status DecodeSaveStall(std::string_view payload, uint64_t* version, double* seconds) {
  if (payload.size() != 16) {
    return Status::InvalidArgument("a save-stall report must be 16 bytes (version, nanoseconds), got " +
                                   std::to_string(payload.size()));
  }
  ByteReader r(payload);
  *version = r.Get<uint64_t>();
  *seconds = static_cast<double>(r.Get<uint64_t>()) / 1e9;
  return Status::Ok();
}

}  // namespace ftrun
