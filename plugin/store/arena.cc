#include "plugin/store/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "plugin/common/hash.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace ftrun {
namespace {

uint32_t HeaderChecksum(const ArenaHeader& h) { return RecordChecksum(&h, offsetof(ArenaHeader, checksum)); }

// Maps the segment shared, asking for it in 2 MiB pages: where the kernel
// gives shared memory huge pages on request (/sys/kernel/mm/
// transparent_hugepage/shmem_enabled = advise), every process's page tables
// hold 512 times fewer entries for the store. That matters at a rank's
// death: a rank comes to map most of the store (each save writes fresh
// extents), and the kernel tears its mapping down before anyone learns of
// the death, ~1 us per 4 KiB page (0.25 s per GiB measured here), which the
// agent's detection of every SIGKILLed rank waited for. Otherwise: no effect.
Status MapFd(int fd, uint64_t size, char** out) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status::FromErrno("mmap of the store segment", errno);
  (void)::madvise(p, size, MADV_HUGEPAGE);
  *out = static_cast<char*>(p);
  return Status::Ok();
}

}  // namespace

Arena::~Arena() { Unmap(); }

Arena::Arena(Arena&& o) noexcept
    : fd_(std::move(o.fd_)), base_(std::exchange(o.base_, nullptr)), size_(std::exchange(o.size_, 0)) {}

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    Unmap();
    fd_ = std::move(o.fd_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void Arena::Unmap() {
  if (base_ != nullptr) ::munmap(base_, size_);
  base_ = nullptr;
  size_ = 0;
}

Status Arena::Create(const std::string& job_id, uint32_t node, uint64_t bytes, uint64_t chunk_size, Arena* out) {
  if (bytes <= kArenaHeaderBytes) return Status::InvalidArgument("store segment too small");
  if (job_id.size() >= sizeof(ArenaHeader::job_id)) {
    return Status::InvalidArgument("job id '" + job_id + "' is longer than 63 characters");
  }
  std::string name = "ftrun-" + job_id + "-node" + std::to_string(node);
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return Status::FromErrno("memfd_create", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return Status::FromErrno("ftruncate of the store segment to " + std::to_string(bytes) + " bytes", errno);
  }
  // Every rank holds this fd read-write (and any same-uid process can reopen
  // it through /proc/<agent>/fd): once sealed, nobody can shrink it (which
  // would SIGBUS the agent on its next access), grow it, or add a seal of
  // its own (F_SEAL_FUTURE_WRITE would stop later ranks from mapping it).
  if (::fcntl(fd.get(), F_ADD_SEALS, kArenaSeals) != 0) return Status::FromErrno("sealing the store segment", errno);
  Arena a;
  // The agent maps without MAP_POPULATE: Prefault does that on a thread.
  FTRUN_RETURN_IF_ERROR(MapFd(fd.get(), bytes, &a.base_));
  a.size_ = bytes;
  a.fd_ = std::move(fd);

  ArenaHeader h{};
  h.magic = kArenaMagic;
  h.format_version = kArenaFormatVersion;
  h.node = node;
  std::memcpy(h.job_id, job_id.data(), job_id.size());
  h.arena_bytes = bytes;
  h.data_offset = kArenaHeaderBytes;
  h.chunk_size = chunk_size;
  h.created_unix_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  h.agent_pid = ::getpid();
  h.checksum = HeaderChecksum(h);
  std::memcpy(a.base_, &h, sizeof(h));
  *out = std::move(a);
  return Status::Ok();
}

Status Arena::Attach(UniqueFd fd, const std::string& expected_job_id, Arena* out) {
  // An unsealed segment could shrink under the rank's mapping (SIGBUS).
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & kArenaSeals) != kArenaSeals) {
    return Status::FailedPrecondition("store segment is not sealed against resizing (an agent of an older build?)");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("fstat of the store segment", errno);
  auto size = static_cast<uint64_t>(st.st_size);
  if (size < kArenaHeaderBytes) {
    return Status::Corruption("store segment is " + std::to_string(size) + " bytes, smaller than its header");
  }
  Arena a;
  FTRUN_RETURN_IF_ERROR(MapFd(fd.get(), size, &a.base_));
  a.size_ = size;
  a.fd_ = std::move(fd);
  ArenaHeader h;
  std::memcpy(&h, a.base_, sizeof(h));
  if (h.magic != kArenaMagic) return Status::Corruption("store segment has a bad magic number: not an ftrun segment");
  if (h.format_version != kArenaFormatVersion) {
    return Status::FailedPrecondition("store segment format " + std::to_string(h.format_version) +
                                      ", this build reads format " + std::to_string(kArenaFormatVersion));
  }
  if (h.checksum != HeaderChecksum(h)) return Status::Corruption("store segment header checksum mismatch");
  h.job_id[sizeof(h.job_id) - 1] = '\0';
  if (!expected_job_id.empty() && expected_job_id != h.job_id) {
    return Status::FailedPrecondition("store segment belongs to job '" + std::string(h.job_id) +
                                      "', this rank is in job '" + expected_job_id + "'");
  }
  if (h.arena_bytes != size) return Status::Corruption("store segment size differs from its header");
  *out = std::move(a);
  return Status::Ok();
}

bool Arena::Prefault(const std::atomic<bool>* cancel) const {
  char* data = base_ + kArenaHeaderBytes;
  const uint64_t n = data_bytes();
  constexpr uint64_t kSlice = 16ull << 20;  // short holds of the mmap lock: other threads may map meanwhile
  // Linux >= 5.14 allocates the pages without changing their contents, so
  // this may race with ranks writing chunks. Older kernels: pages fault in
  // on first use instead.
  for (uint64_t off = 0; off < n; off += kSlice) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) return false;
    if (::madvise(data + off, std::min(kSlice, n - off), MADV_POPULATE_WRITE) != 0) return false;
  }
  return true;
}

}  // namespace ftrun
