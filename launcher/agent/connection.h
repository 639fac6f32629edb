// Connection: one rank's socket to the agent, with its decoder, its outbox
// and what the store lent it (reservations are keyed by id, pins listed
// here).
//
// Replies never block the agent's loop: Send queues the frame and writes
// what the socket takes; the rest goes out when epoll says it is writable.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "plugin/common/fd.h"
#include "plugin/ipc/wire.h"

namespace ftrun {

struct Connection {
  // A rank that stops reading (SIGSTOP) while more than this is queued is
  // cut off when the next frame comes.
  static constexpr size_t kMaxOutbox = 64u << 20;
  // What one connection may cost the agent's loop (the rest waits for the
  // next wakeup, so other ranks are served in between), and the largest
  // frame it may send: a hello is small; a save's manifest is the largest
  // frame a rank sends (32 bytes a chunk, plus its user bytes).
  static constexpr size_t kReadBudget = 1u << 20;
  static constexpr uint32_t kMaxHelloFrame = 64u << 10;
  static constexpr uint32_t kMaxRankFrame = 128u << 20;
  // More than this within one second is a flood, not a rank at work (a
  // save is a few frames, a round trip each): the connection is dropped.
  static constexpr uint64_t kMaxFramesPerSecond = 100000;
  static constexpr uint64_t kMaxBytesPerSecond = 1ull << 30;

  uint64_t id = 0;
  UniqueFd fd;
  FrameReader reader;
  pid_t pid = 0;
  std::chrono::steady_clock::time_point accepted;
  int rank = -1;        // global rank, once the hello is accepted
  int generation = -1;  // the rank generation it belongs to
  // A warm control link (warm_ranks.h): a process under @ftrun.resilient,
  // kept across generations (a stop does not close it).
  bool control = false;
  // A writer of rank `rank` (rank_hello.h): it saves for the rank, is not it.
  bool writer = false;
  bool greeted() const { return rank >= 0 || control; }
  std::vector<uint64_t> pins;
  // The first failure sticks: once a write fails the connection is closed.
  bool broken = false;
  bool want_write = false;     // the outbox is not empty: poll for EPOLLOUT
  bool polling_write = false;  // EPOLLOUT is registered (the agent's view)

  // Queues a frame (with a descriptor riding on its first byte, if any) and
  // writes what the socket takes now.
  Status Send(MsgType type, const std::string& payload, int pass_fd = -1);
  Status SendError(const Status& s) { return Send(MsgType::kError, EncodeError(s)); }
  // Writes queued bytes until the socket is full or the outbox empty.
  Status Flush();
  // Counts one received frame of `bytes`; an error once the peer sends more
  // than kMaxFramesPerSecond frames or kMaxBytesPerSecond bytes in a second.
  Status Received(std::chrono::steady_clock::time_point now, size_t bytes);

 private:
  std::string outbox_;
  std::chrono::steady_clock::time_point window_start_;
  uint64_t window_frames_ = 0;
  uint64_t window_bytes_ = 0;
  size_t sent_ = 0;
  int pass_fd_ = -1;  // not owned; sent with the first byte of the outbox
};

}  // namespace ftrun
