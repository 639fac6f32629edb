// Snapshot::Map: a restored tensor as a copy-on-write view of the store.
//
// Why: after a restart a rank's loaded state usually goes straight into its
// model and optimizer (load_state_dict copies it there), so a copy into
// fresh memory first costs the restore a page fault per 4 KiB of the state
// (~1 GB/s on the development VM) for bytes that are read once. Mapped
// MAP_PRIVATE from the store's memfd, the tensor's pages are the store's
// own until written; reading them costs page-table updates only.
//
// How: the chunks of a tensor lie anywhere in the segment (unchanged chunks
// are shared with older versions), so a PROT_NONE range of the tensor's size
// is reserved and each chunk mapped over its place in it with MAP_FIXED.
// That needs every chunk to start on a page of the segment and every chunk
// but the last to be a whole number of pages (the extent allocator and the
// chunk size make it so); otherwise Map says so and the caller reads.
//
// Lifetime: a private file mapping shows later changes of the file in pages
// it has not written. The store does not change a version's extents while
// the version is pinned (the Snapshot is open), so the Snapshot must outlive
// the mapping or Detach must come first: it makes every page private.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "plugin/client/client_impl.h"

namespace ftrun {

MappedTensor::MappedTensor(void* base, uint64_t span, void* data, uint64_t nbytes)
    : base_(base), span_(span), data_(data), nbytes_(nbytes) {}

MappedTensor::~MappedTensor() {
  if (base_ != nullptr) ::munmap(base_, span_);
}

Status MappedTensor::Detach() {
  if (detached_ || nbytes_ == 0) return Status::Ok();
  // One write fault per page not written yet: the kernel copies it.
  if (PopulateRange(base_, span_, MADV_POPULATE_WRITE) != 0) {
    if (errno != EINVAL) return Status::FromErrno("madvise(MADV_POPULATE_WRITE) of a loaded tensor", errno);
    // Before Linux 5.14: write every page without changing it; an atomic
    // add of 0 cannot lose another thread's concurrent write.
    const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    auto* p = static_cast<unsigned char*>(base_);
    for (uint64_t off = 0; off < span_; off += page) __atomic_fetch_add(p + off, 0, __ATOMIC_RELAXED);
  }
  detached_ = true;
  return Status::Ok();
}

Status Snapshot::Map(std::string_view name, std::unique_ptr<MappedTensor>* out) const {
  const TensorManifest* tm = nullptr;
  std::string where;
  FTRUN_RETURN_IF_ERROR(impl_->Find(name, &tm, &where));
  const Arena& arena = impl_->client->arena();
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  auto pages = [&](uint64_t n) { return (n + page - 1) / page * page; };
  for (size_t j = 0; j < tm->chunks.size(); ++j) {
    const ChunkRef& c = tm->chunks[j];
    FTRUN_RETURN_IF_ERROR(impl_->CheckBounds(c, j, where));
    const bool last = j + 1 == tm->chunks.size();
    if (c.offset % page != 0 || (!last && c.length % page != 0) || pages(c.length) > arena.size() - c.offset) {
      return Status::FailedPrecondition(where + " chunk " + std::to_string(j) + " is not page-aligned in the store");
    }
  }
  const uint64_t span = std::max(pages(tm->info.nbytes), page);
  void* base = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return Status::FromErrno("mmap of " + where, errno);
  auto mapped = std::make_unique<MappedTensor>(base, span, base, tm->info.nbytes);
  char* at = static_cast<char*>(base);
  for (const ChunkRef& c : tm->chunks) {
    void* p = ::mmap(at, pages(c.length), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, arena.fd(),
                     static_cast<off_t>(c.offset));
    if (p == MAP_FAILED) return Status::FromErrno("mmap of " + where, errno);
    at += c.length;
  }
  // Map every page in one call rather than a fault per page, then check the
  // bytes this process will see.
  (void)PopulateRange(base, span, MADV_POPULATE_READ);
  std::vector<ChunkHash> hashes;
  const char* in = static_cast<const char*>(base);
  for (size_t j = 0; j < tm->chunks.size(); ++j) {
    const ChunkRef& c = tm->chunks[j];
    ChunkHash h = HashBytes(in, c.length);
    if (h != c.hash) return impl_->Corrupted(*tm, j, h, where);
    in += c.length;
    hashes.push_back(h);
  }
  impl_->Remember(*tm, std::move(hashes));
  *out = std::move(mapped);
  return Status::Ok();
}

}  // namespace ftrun
