// Framing of the agent <-> rank protocol over a unix stream socket: a
// 12-byte header (magic, type, length) then the payload. One file
// descriptor may ride along a frame (SCM_RIGHTS), used for the memfd.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ftrun/status.h"
#include "plugin/common/fd.h"

namespace ftrun {

enum class MsgType : uint16_t {
  kHello = 1,       // rank -> agent: protocol version, rank, pid, job id
  kHelloOk,         // agent -> rank (+ memfd): job, node, arena, restore version
  kError,           // agent -> rank: code, message
  kAlloc,           // rank -> agent: version, chunk lengths to reserve
  kAllocOk,         // agent -> rank: offsets
  kSave,            // rank -> agent: manifest
  kSaveOk,          // agent -> rank: version, committed version
  kLoad,            // rank -> agent: version (or latest committed)
  kLoadOk,          // agent -> rank: manifest with arena offsets
  kLoadDone,        // rank -> agent: unpin a loaded version (no reply)
  kList,            // rank -> agent
  kListOk,          // agent -> rank: committed, pending, restore
  kProgress,        // rank -> agent: step (no reply)
  kWaitCommitted,   // rank -> agent: version, timeout
  kCommitted,       // agent -> rank: committed version
  kCorruptChunk,    // rank -> agent: version, tensor, chunk index, the hash its bytes have
  kCorruptChunkOk,  // agent -> rank: what the agent found and did (text)
  kSaveStall,       // rank -> agent: version, nanoseconds its caller spent inside the save (no reply)

  // A process under @ftrun.resilient, over its second connection (its
  // control link, launcher/agent/warm_ranks.h). Payloads are key=value lines
  // (plugin/protocol/warm_fields.h).
  kWarmHello = 32,  // process -> agent: role (rank or standby), rank, job
  kWarmAbort,       // agent -> process: leave generation N now
  kWarmParked,      // process -> agent: out of the decorated function, its process group gone
  kWarmStart,       // agent -> process: generation, restore version, the rank's variables
  kWarmFailed,      // process -> agent: its training function raised (generation, reason); it leaves

  // ftrun-agent attaching to a Slurm standby agent (launcher/agent/standby.h).
  kAttach = 64,    // attacher -> standby (+ its stdout): argv, environment, cwd
  kAttachFd,       // attacher -> standby (+ its stderr)
  kAttachSignal,   // attacher -> standby: a signal to forward to the agent
  kAttachExit,     // standby -> attacher: the agent's exit code
  kAttachRefused,  // standby -> attacher: why not
};

inline constexpr uint32_t kFrameMagic = 0x46545231;  // "FTR1"
inline constexpr uint32_t kProtocolVersion = 3;      // 3: kSaveStall
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
Status RecvFrame(int fd, int timeout_ms, MsgType* type, std::string* payload, UniqueFd* received_fd = nullptr);

// Incremental decoder for a non-blocking socket (the agent's and the
// standby's side). Bounded: each ReadFrom takes at most `budget` bytes (then
// the caller serves its other sockets; a level-triggered poll brings it
// back), a frame longer than max_frame() is refused at its header, before
// its payload is read, and descriptors passed with the frames are kept only
// when accept_fds() is on (at most kMaxPendingFds at a time).
class FrameReader {
 public:
  static constexpr size_t kMaxPendingFds = 4;

  // Reads what the socket has, up to `budget` bytes. kUnavailable at EOF,
  // kIoError on errors, kResourceExhausted for too many passed descriptors.
  Status ReadFrom(int fd, size_t budget = SIZE_MAX);
  // Pops the next complete frame, if any, with the descriptor that came
  // with its bytes (when fd is given and accept_fds() is on). A bad magic or
  // an oversized length makes it return false with the reason in status().
  bool Next(MsgType* type, std::string* payload, UniqueFd* fd = nullptr);
  const Status& status() const { return status_; }
  // True while bytes of an unfinished frame are buffered.
  bool partial() const { return pos_ < buf_.size(); }

  uint32_t max_frame() const { return max_frame_; }
  void set_max_frame(uint32_t bytes) { max_frame_ = bytes; }
  void set_accept_fds(bool on) { accept_fds_ = on; }

 private:
  struct PassedFd {
    uint64_t at;  // stream offset of the last byte read with it
    UniqueFd fd;
  };
  std::string buf_;
  size_t pos_ = 0;
  uint64_t base_ = 0;  // stream offset of buf_[0]
  uint32_t max_frame_ = kMaxFrameBytes;
  bool accept_fds_ = false;
  std::vector<PassedFd> fds_;
  Status status_;
};

std::string EncodeError(const Status& s);
Status DecodeError(std::string_view payload);

// kSaveStall's payload: the version and the seconds inside the save (as
// nanoseconds). Decode refuses anything but those 16 bytes.
std::string EncodeSaveStall(uint64_t version, double seconds);
Status DecodeSaveStall(std::string_view payload, uint64_t* version, double* seconds);

}  // namespace ftrun
