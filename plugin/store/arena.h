// Arena: the agent's shared-memory segment. One memfd, mapped by the agent
// and by every local rank (the fd travels over the agent socket with
// SCM_RIGHTS, so no /dev/shm name exists for another job to find).
//
// Layout: a 4 KiB header page holding ArenaHeader, then the data area where
// chunk extents live (managed by ExtentAllocator, owned by the agent).
#pragma once

#include <fcntl.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ftrun/status.h"
#include "plugin/common/fd.h"

namespace ftrun {

inline constexpr uint64_t kArenaMagic = 0x414e455241525446ull;  // "FTRARENA"
inline constexpr uint32_t kArenaFormatVersion = 1;
inline constexpr uint64_t kArenaHeaderBytes = 4096;
// The seals Create applies once the segment has its size (fcntl F_ADD_SEALS):
// F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL. Attach refuses a segment without
// them.
inline constexpr int kArenaSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// Plain data at offset 0 of the segment; checksum covers every field before it.
struct ArenaHeader {
  uint64_t magic;
  uint32_t format_version;
  uint32_t node;
  char job_id[64];       // NUL-terminated
  uint64_t arena_bytes;  // whole segment, header included
  uint64_t data_offset;
  uint64_t chunk_size;
  uint64_t created_unix_ns;
  int32_t agent_pid;
  uint32_t checksum;
};
static_assert(std::is_trivially_copyable_v<ArenaHeader>);
static_assert(sizeof(ArenaHeader) <= kArenaHeaderBytes);

class Arena {
 public:
  Arena() = default;
  ~Arena();
  Arena(Arena&& o) noexcept;
  Arena& operator=(Arena&& o) noexcept;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Agent side: creates a memfd of `bytes` (header included), seals its size
  // (kArenaSeals), maps it and writes the header. Does not touch the data pages (see Prefault).
  static Status Create(const std::string& job_id, uint32_t node, uint64_t bytes, uint64_t chunk_size, Arena* out);
  // Rank side: maps a received fd and checks magic, format version,
  // checksum and job id. Takes ownership of fd.
  static Status Attach(UniqueFd fd, const std::string& expected_job_id, Arena* out);

  // Allocates every data page so saves never pay first-touch page faults
  // (MADV_POPULATE_WRITE; a no-op on kernels before 5.14). Safe to run on
  // another thread while the arena is in use; the arena must outlive it.
  // Stops early once *cancel becomes true.
  // Returns false when cancelled or unsupported.
  bool Prefault(const std::atomic<bool>* cancel = nullptr) const;

  int fd() const { return fd_.get(); }
  char* base() const { return base_; }
  uint64_t size() const { return size_; }
  uint64_t data_offset() const { return kArenaHeaderBytes; }
  uint64_t data_bytes() const { return size_ - kArenaHeaderBytes; }

 private:
  void Unmap();

  UniqueFd fd_;
  char* base_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace ftrun
