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
  uint64_t reserved_version = 0;  // the save its store reservations are for

  Status Send(MsgType type, const std::string& payload, int pass_fd = -1) const {
    return SendFrame(fd.get(), type, payload, pass_fd);
  }
  Status SendError(const Status& s) const { return Send(MsgType::kError, EncodeError(s)); }
};

}  // namespace ftrun
