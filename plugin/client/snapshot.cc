// Load: the agent hands over a manifest with arena offsets and keeps the
// version pinned; Read copies chunks out, checking each one's hash (Map, in
// mapped_tensor.cc, maps them instead).
#include <cstdint>
#include <cstring>

#include "plugin/client/client_impl.h"
#include "plugin/client/device_saver.h"
#include "plugin/common/bytes.h"
#include "plugin/ipc/rank_messages.h"

namespace ftrun {

Snapshot::Snapshot(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Snapshot::~Snapshot() {
  // ReadToDevice's copies read this version's extents: they must land
  // before the agent may hand the extents out again.
  if (impl_->device_reads) (void)impl_->client->device->FenceRestores();
  (void)impl_->client->Notify(MsgType::kLoadDone, Encode(VersionMsg{impl_->manifest.version}));  // best effort
}

uint64_t Snapshot::version() const { return impl_->manifest.version; }
const std::vector<TensorInfo>& Snapshot::tensors() const { return impl_->infos; }
const std::string& Snapshot::user_bytes() const { return impl_->manifest.user_bytes; }

Status Snapshot::Impl::Find(std::string_view name, const TensorManifest** tm, std::string* where) const {
  *tm = nullptr;
  for (const auto& t : manifest.tensors) {
    if (t.info.name == name) *tm = &t;
  }
  *where = "version " + std::to_string(manifest.version) + " tensor '" + std::string(name) + "'";
  if (*tm == nullptr) return Status::NotFound(*where + " is not in the snapshot");
  return Status::Ok();
}

Status Snapshot::Impl::FindSized(std::string_view name, uint64_t dst_bytes, const TensorManifest** tm,
                                 std::string* where) const {
  FTRUN_RETURN_IF_ERROR(Find(name, tm, where));
  if (dst_bytes != (*tm)->info.nbytes) {
    return Status::InvalidArgument(*where + " is " + std::to_string((*tm)->info.nbytes) + " bytes, the destination " +
                                   std::to_string(dst_bytes));
  }
  return Status::Ok();
}

Status Snapshot::Impl::CheckBounds(const ChunkRef& c, size_t j, const std::string& where) const {
  const Arena& arena = client->arena();
  if (c.offset < arena.data_offset() || c.length > arena.size() || c.offset > arena.size() - c.length) {
    return Status::Corruption(where + " chunk " + std::to_string(j) + " lies outside the store segment");
  }
  return Status::Ok();
}

Status Snapshot::Impl::HashMismatch(const ChunkRef& c, size_t j, const ChunkHash& got, const std::string& where) {
  return Status::Corruption(where + " chunk " + std::to_string(j) + ": bytes hash to " + got.ToHex() +
                            ", the manifest says " + c.hash.ToHex() + " (corrupted in shared memory)");
}

Status Snapshot::Impl::Corrupted(const TensorManifest& tm, size_t j, const ChunkHash& got,
                                 const std::string& where) const {
  Status bad = HashMismatch(tm.chunks[j], j, got, where);
  const std::string report = Encode(CorruptChunkReport{manifest.version, tm.info.name, j, got});
  std::string reply;
  Status s = client->Call(MsgType::kCorruptChunk, report, MsgType::kCorruptChunkOk, &reply);
  if (!s.ok()) return Status::Corruption(bad.message() + "; could not tell the agent: " + s.message());
  return Status::Corruption(bad.message() + "; the agent: " + reply);
}

void Snapshot::Impl::Remember(const TensorManifest& tm, std::vector<ChunkHash> hashes) const {
  CachedTensor seen;
  seen.nbytes = tm.info.nbytes;
  seen.hashes = std::move(hashes);
  seen.changed_last.assign(seen.hashes.size(), false);
  client->cache[tm.info.name] = std::move(seen);
}

namespace {

// Read and Refresh: tensor `name` into host memory dst, chunk by chunk, each
// hashed as it is copied from the store. held: dst may already hold some of
// it (live memory): a chunk whose bytes there hash to the saved hash is
// left as it is. Else dst is usually fresh memory, faulted in at once.
Status CopyIn(const Snapshot::Impl& impl, std::string_view name, void* dst, uint64_t dst_bytes, bool held) {
  const TensorManifest* tm = nullptr;
  std::string where;
  FTRUN_RETURN_IF_ERROR(impl.FindSized(name, dst_bytes, &tm, &where));
  const Arena& arena = impl.client->arena();
  if (!held) PopulateRange(dst, dst_bytes, MADV_POPULATE_WRITE);  // one call, not a trap per 4 KiB page
  std::vector<ChunkHash> hashes;
  char* out = static_cast<char*>(dst);
  for (size_t j = 0; j < tm->chunks.size(); ++j) {
    const ChunkRef& c = tm->chunks[j];
    FTRUN_RETURN_IF_ERROR(impl.CheckBounds(c, j, where));
    ChunkHash h{};
    if (!held || (h = HashBytes(out, c.length)) != c.hash) {
      PopulateRange(arena.base() + c.offset, c.length, MADV_POPULATE_READ);  // this process maps it lazily
      h = HashAndCopy(out, arena.base() + c.offset, c.length);
      if (h != c.hash) return impl.Corrupted(*tm, j, h, where);
    }
    out += c.length;
    hashes.push_back(h);
  }
  impl.Remember(*tm, std::move(hashes));
  return Status::Ok();
}

}  // namespace

Status Snapshot::Read(std::string_view name, void* dst, uint64_t dst_bytes) const {
  return CopyIn(*impl_, name, dst, dst_bytes, /*held=*/false);
}

Status Snapshot::Refresh(std::string_view name, void* dst, uint64_t dst_bytes) const {
  return CopyIn(*impl_, name, dst, dst_bytes, /*held=*/true);
}

Status Snapshot::ReadToDevice(std::string_view name, void* dst, uint64_t dst_bytes, void* cuda_stream) const {
  const TensorManifest* tm = nullptr;
  std::string where;
  FTRUN_RETURN_IF_ERROR(impl_->FindSized(name, dst_bytes, &tm, &where));
  Client::Impl* client = impl_->client;
  if (!client->device) FTRUN_RETURN_IF_ERROR(DeviceSaver::Create(client, &client->device));
  // Every chunk is checked before any is queued: a corrupted version puts
  // nothing on the device. The copies read the store itself, which this
  // snapshot keeps pinned until its destructor fences them.
  const Arena& arena = client->arena();
  std::vector<ChunkHash> hashes;
  for (size_t j = 0; j < tm->chunks.size(); ++j) {
    const ChunkRef& c = tm->chunks[j];
    FTRUN_RETURN_IF_ERROR(impl_->CheckBounds(c, j, where));
    ChunkHash h = HashBytes(arena.base() + c.offset, c.length);
    if (h != c.hash) return impl_->Corrupted(*tm, j, h, where);
    hashes.push_back(h);
  }
  // One copy per run of chunks that lie back to back in the store.
  char* out = static_cast<char*>(dst);
  for (size_t j = 0; j < tm->chunks.size();) {
    const uint64_t start = tm->chunks[j].offset;
    uint64_t n = tm->chunks[j].length;
    size_t end = j + 1;
    for (; end < tm->chunks.size() && tm->chunks[end].offset == start + n; ++end) n += tm->chunks[end].length;
    FTRUN_RETURN_IF_ERROR(client->device->CopyToDevice(out, arena.base() + start, n, cuda_stream));
    out += n;
    j = end;
  }
  impl_->device_reads = true;
  impl_->Remember(*tm, std::move(hashes));
  return Status::Ok();
}

Status Client::Load(uint64_t version, std::unique_ptr<Snapshot>* out) {
  FTRUN_RETURN_IF_ERROR(Wait());
  std::string reply;
  FTRUN_RETURN_IF_ERROR(impl_->Call(MsgType::kLoad, Encode(VersionMsg{version}), MsgType::kLoadOk, &reply));
  auto si = std::make_unique<Snapshot::Impl>();
  si->client = impl_.get();
  ByteReader r(reply);
  FTRUN_RETURN_IF_ERROR(DecodeManifest(&r, "manifest from the agent", &si->manifest));
  for (const auto& t : si->manifest.tensors) si->infos.push_back(t.info);
  out->reset(new Snapshot(std::move(si)));
  return Status::Ok();
}

}  // namespace ftrun
