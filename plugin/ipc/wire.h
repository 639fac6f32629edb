// Framing of the agent <-> rank protocol over a unix stream socket: a
// 12-byte header (magic, type, length) then the payload. One file
// descriptor may ride along a frame (SCM_RIGHTS), used for the memfd.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "ftrun/status.h"
#include "plugin/common/fd.h"

namespace ftrun {

enum class MsgType : uint16_t {
  kHello = 1,      // rank -> agent: protocol version, rank, pid, job id
  kHelloOk,        // agent -> rank (+ memfd): job, node, arena, restore version
  kError,          // agent -> rank: code, message
  kAlloc,          // rank -> agent: version, chunk lengths to reserve
  kAllocOk,        // agent -> rank: offsets
  kSave,           // rank -> agent: manifest
  kSaveOk,         // agent -> rank: version, committed version
  kLoad,           // rank -> agent: version (or latest committed)
  kLoadOk,         // agent -> rank: manifest with arena offsets
  kLoadDone,       // rank -> agent: unpin a loaded version (no reply)
  kList,           // rank -> agent
  kListOk,         // agent -> rank: committed, pending, restore
  kProgress,       // rank -> agent: step (no reply)
  kWaitCommitted,  // rank -> agent: version, timeout
  kCommitted,      // agent -> rank: committed version
  kCorruptChunk,   // rank -> agent: version, tensor, chunk index, the hash its bytes have
  kCorruptChunkOk, // agent -> rank: what the agent found and did (text)

  // ftrun-agent attaching to a Slurm standby agent (launcher/agent/standby.h).
  kAttach = 64,    // attacher -> standby (+ its stdout): argv, environment, cwd
  kAttachFd,       // attacher -> standby (+ its stderr)
  kAttachSignal,   // attacher -> standby: a signal to forward to the agent
  kAttachExit,     // standby -> attacher: the agent's exit code
  kAttachRefused,  // standby -> attacher: why not
};

inline constexpr uint32_t kFrameMagic = 0x46545231;  // "FTR1"
inline constexpr uint32_t kProtocolVersion = 2;
inline constexpr uint32_t kMaxFrameBytes = 512u << 20;

struct FrameHeader {
  uint32_t magic;
  uint16_t type;
  uint16_t flags;
  uint32_t length;
};
static_assert(sizeof(FrameHeader) == 12);

// Sends a whole frame, blocking; EINTR and short writes are retried. On a
// non-blocking socket it waits for room, but kTimeout after 5 s without any.
Status SendFrame(int fd, MsgType type, std::string_view payload, int pass_fd = -1);

// One sendmsg() of iov, with pass_fd (if >= 0) attached as SCM_RIGHTS.
// Returns what sendmsg returns (errno set on -1). MSG_NOSIGNAL is added.
ssize_t SendMsgWithFd(int sock, iovec* iov, size_t iovcnt, int pass_fd, int flags);

// Receives one whole frame, blocking up to timeout_ms (-1: forever). A
// passed descriptor, if any, lands in *received_fd.
Status RecvFrame(int fd, int timeout_ms, MsgType* type, std::string* payload,
                 UniqueFd* received_fd = nullptr);

// Incremental decoder for a non-blocking socket (the agent side).
class FrameReader {
 public:
  // Reads what the socket has. kUnavailable at EOF, kIoError on errors.
  Status ReadFrom(int fd);
  // Pops the next complete frame, if any. A bad magic or an oversized
  // length makes it return kCorruption through status().
  bool Next(MsgType* type, std::string* payload);
  const Status& status() const { return status_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
  Status status_;
};

std::string EncodeError(const Status& s);
Status DecodeError(std::string_view payload);

}  // namespace ftrun
