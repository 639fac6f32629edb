// Connection: one rank's socket to the agent, with its decoder and what the
// store lent it (reservations are keyed by id, pins listed here).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "plugin/common/fd.h"
#include "plugin/ipc/wire.h"

namespace ftrun {

struct Connection {
  uint64_t id = 0;
  UniqueFd fd;
  FrameReader reader;
  pid_t pid = 0;
  int rank = -1;        // global rank, once the hello is accepted
  int generation = -1;  // the rank generation it belongs to
  std::vector<uint64_t> pins;
  // The first failure sticks: after a send fails the connection is closed.
  mutable bool broken = false;

  Status Send(MsgType type, const std::string& payload, int pass_fd = -1) const {
    if (broken) return Status::Unavailable("connection already failed");
    Status s = SendFrame(fd.get(), type, payload, pass_fd);
    if (!s.ok()) broken = true;  // a frame may be half sent: the stream is unusable
    return s;
  }
  Status SendError(const Status& s) const { return Send(MsgType::kError, EncodeError(s)); }
};

}  // namespace ftrun
