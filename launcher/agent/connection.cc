#include "launcher/agent/connection.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace ftrun {

Status Connection::Send(MsgType type, const std::string& payload, int pass_fd) {
  if (broken) return Status::Unavailable("connection already failed");
  // The cap bounds the backlog a silent peer can build up; one frame of any
  // size is always queued.
  if (outbox_.size() - sent_ > kMaxOutbox) {
    broken = true;
    return Status::Unavailable("rank " + std::to_string(rank) + " stopped reading its replies");
  }
  if (pass_fd >= 0) {
    // Only the hello reply carries a descriptor, and it is the first frame.
    if (sent_ != outbox_.size()) return Status::FailedPrecondition("a descriptor must start the outbox");
    pass_fd_ = pass_fd;
  }
  FrameHeader h{kFrameMagic, static_cast<uint16_t>(type), 0, static_cast<uint32_t>(payload.size())};
  outbox_.append(reinterpret_cast<const char*>(&h), sizeof(h));
  outbox_.append(payload);
  return Flush();
}

Status Connection::Flush() {
  while (sent_ < outbox_.size()) {
    iovec iov{outbox_.data() + sent_, outbox_.size() - sent_};
    ssize_t n = SendMsgWithFd(fd.get(), &iov, 1, pass_fd_, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      broken = true;
      return Status::FromErrno("send to rank " + std::to_string(rank), errno);
    }
    pass_fd_ = -1;
    sent_ += static_cast<size_t>(n);
  }
  if (sent_ == outbox_.size() || sent_ > (1u << 20)) {
    outbox_.erase(0, sent_);
    sent_ = 0;
  }
  want_write = sent_ < outbox_.size();
  return Status::Ok();
}

Status Connection::Received(std::chrono::steady_clock::time_point now, size_t bytes) {
  if (now - window_start_ >= std::chrono::seconds(1)) {
    window_start_ = now;
    window_frames_ = 0;
    window_bytes_ = 0;
  }
  ++window_frames_;
  window_bytes_ += bytes;
  if (window_frames_ > kMaxFramesPerSecond || window_bytes_ > kMaxBytesPerSecond) {
    return Status::ResourceExhausted("flooding: more than " +
                                     (window_frames_ > kMaxFramesPerSecond
                                          ? std::to_string(kMaxFramesPerSecond) + " frames"
                                          : std::to_string(kMaxBytesPerSecond >> 20) + " MiB") +
                                     " in one second");
  }
  return Status::Ok();
}

}  // namespace ftrun
