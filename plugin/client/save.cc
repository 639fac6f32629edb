// The host save path: classify each chunk (skip by generation, hash-only,
// or copy), reserve extents for the ones to copy, copy them into shared
// memory (hashing fused with the copy), then hand the manifest to the agent.
#include <chrono>
#include <cstring>
#include <unordered_set>

#include "plugin/client/client_impl.h"
#include "plugin/common/bytes.h"
#include "plugin/ipc/rank_messages.h"

namespace ftrun {
namespace {

enum class Work : uint8_t { kCopyKnownHash, kCopyFused };

struct PendingCopy {
  size_t tensor;
  size_t chunk;
  const char* src;
  Work work;
  const CachedTensor* prev;  // the tensor's cache entry, if any
};

}  // namespace

Status Client::Impl::CheckTensors(const std::vector<TensorRef>& tensors) const {
  std::unordered_set<std::string_view> names;
  for (const auto& t : tensors) {
    const std::string where = "rank " + std::to_string(rank) + ": tensor '" + t.name + "'";
    if (t.name.empty()) return Status::InvalidArgument("rank " + std::to_string(rank) + ": a tensor has an empty name");
    if (!names.insert(t.name).second) return Status::InvalidArgument(where + " is given twice");
    if (DTypeSize(t.dtype) == 0) return Status::InvalidArgument(where + " has an unknown dtype");
    uint64_t bytes = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) return Status::InvalidArgument(where + " has a negative dimension");
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
        return Status::InvalidArgument(where + ": shape " + ShapeString(t.shape) + " overflows 64 bits");
      }
    }
    if (bytes != t.nbytes) {
      return Status::InvalidArgument(where + ": shape " + ShapeString(t.shape) + " of " + DTypeName(t.dtype) + " is " +
                                     std::to_string(bytes) + " bytes, nbytes is " + std::to_string(t.nbytes));
    }
    if (t.nbytes > 0 && t.data == nullptr) return Status::InvalidArgument(where + " has no data pointer");
  }
  return Status::Ok();
}

const CachedTensor* Client::Impl::Cached(const TensorRef& t) const {
  auto it = cache.find(t.name);
  const size_t n = static_cast<size_t>((t.nbytes + chunk_size - 1) / chunk_size);
  return it != cache.end() && it->second.nbytes == t.nbytes && it->second.hashes.size() == n ? &it->second : nullptr;
}

void Client::Impl::BeginSave(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes,
                             PendingSave* p) const {
  p->manifest = Manifest{};
  p->manifest.rank = rank;
  p->manifest.version = version;
  p->manifest.user_bytes.assign(user_bytes.data(), user_bytes.size());
  p->manifest.tensors.resize(tensors.size());
  p->fresh.assign(tensors.size(), CachedTensor{});
  p->stats = SaveStats{};
  p->reserved = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    TensorManifest& tm = p->manifest.tensors[i];
    tm.info = {t.name, t.dtype, t.shape, t.nbytes, t.device};
    const size_t n = static_cast<size_t>((t.nbytes + chunk_size - 1) / chunk_size);
    tm.chunks.resize(n);
    for (size_t j = 0; j < n; ++j) tm.chunks[j].length = std::min<uint64_t>(chunk_size, t.nbytes - j * chunk_size);
    CachedTensor& f = p->fresh[i];
    f.generation = t.generation;
    f.nbytes = t.nbytes;
    f.hashes.resize(n);
    f.changed_last.assign(n, false);
    p->stats.chunks_total += n;
    p->stats.bytes_total += t.nbytes;
  }
}

Status Client::Impl::Reserve(PendingSave* p, const std::vector<uint64_t>& lengths, std::vector<uint64_t>* offsets) {
  offsets->clear();
  if (lengths.empty()) return Status::Ok();
  AllocMsg ask;
  ask.version = p->manifest.version;
  ask.first = !p->reserved;  // first of this attempt
  p->reserved = true;
  ask.lengths = lengths;
  std::string reply;
  FTRUN_RETURN_IF_ERROR(Call(MsgType::kAlloc, Encode(ask), MsgType::kAllocOk, &reply));
  AllocOkMsg got;
  FTRUN_RETURN_IF_ERROR(Decode(reply, &got));
  if (got.offsets.size() != lengths.size()) return Status::Corruption("agent reserved the wrong number of extents");
  for (size_t i = 0; i < lengths.size(); ++i) {
    const uint64_t off = got.offsets[i];
    if (off < arena().data_offset() || lengths[i] > arena().size() || off > arena().size() - lengths[i]) {
      return Status::Corruption("agent reserved an extent outside the store segment");
    }
    offsets->push_back(off);
  }
  return Status::Ok();
}

Status Client::Impl::StageHost(const std::vector<TensorRef>& tensors, PendingSave* p) {
  Manifest& m = p->manifest;
  SaveStats& st = p->stats;
  std::vector<PendingCopy> copies;
  std::vector<uint64_t> lengths;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    if (t.device != Device::kHost) continue;
    const CachedTensor* prev = Cached(t);
    const bool unchanged = prev != nullptr && t.generation != 0 && prev->generation == t.generation;
    // A new generation says the tensor changed: copy without hashing first.
    const bool changed = prev != nullptr && t.generation != 0 && prev->generation != t.generation;
    const char* base = static_cast<const char*>(t.data);
    for (size_t j = 0; j < m.tensors[i].chunks.size(); ++j) {
      ChunkRef& c = m.tensors[i].chunks[j];
      const char* src = base + j * chunk_size;
      if (unchanged) {
        c.hash = prev->hashes[j];
        st.chunks_skipped++;
      } else if (prev != nullptr && !prev->changed_last[j] && !changed) {
        // Did not change last time: likely unchanged again, so hash first
        // and copy only on a mismatch.
        c.hash = HashBytes(src, c.length);
        st.bytes_hashed += c.length;
        if (c.hash == prev->hashes[j]) {
          st.chunks_unchanged++;
        } else {
          copies.push_back({i, j, src, Work::kCopyKnownHash, prev});
          lengths.push_back(c.length);
        }
      } else {
        copies.push_back({i, j, src, Work::kCopyFused, prev});
        lengths.push_back(c.length);
      }
    }
  }
  std::vector<uint64_t> offsets;
  FTRUN_RETURN_IF_ERROR(Reserve(p, lengths, &offsets));
  for (size_t k = 0; k < copies.size(); ++k) {
    const PendingCopy& pc = copies[k];
    ChunkRef& c = m.tensors[pc.tensor].chunks[pc.chunk];
    char* dst = arena().base() + offsets[k];
    if (pc.work == Work::kCopyKnownHash) {
      std::memcpy(dst, pc.src, c.length);
    } else {
      c.hash = HashAndCopy(dst, pc.src, c.length);
      st.bytes_hashed += c.length;
      if (pc.prev != nullptr && pc.prev->hashes[pc.chunk] == c.hash) {
        st.chunks_unchanged++;  // copied for nothing; the agent frees the extent
        continue;
      }
    }
    c.offset = offsets[k];
    p->fresh[pc.tensor].changed_last[pc.chunk] = true;
    st.chunks_copied++;
    st.bytes_copied += c.length;
  }
  return Status::Ok();
}

void Client::Impl::ForgetChangeHistory() {
  for (auto& [name, entry] : cache) entry.changed_last.assign(entry.changed_last.size(), false);
}

Status Client::Impl::SaveHost(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes,
                              SaveStats* stats, bool retried) {
  auto t0 = std::chrono::steady_clock::now();
  FTRUN_RETURN_IF_ERROR(CheckTensors(tensors));
  PendingSave p;
  BeginSave(version, tensors, user_bytes, &p);
  Status s = StageHost(tensors, &p);
  if (s.ok()) s = SendManifest(&p);
  if (!retried && s.code() == Code::kResourceExhausted) {
    // Copy-then-hash wants room for every chunk it might copy. Before
    // giving up, hash first so only truly changed chunks need room.
    ForgetChangeHistory();
    return SaveHost(version, tensors, user_bytes, stats, true);
  }
  if (!retried && s.code() == Code::kChunkMissing) {
    // Our cache referenced chunks the store dropped (e.g. after a restart
    // discarded their version): forget it and copy everything.
    cache.clear();
    return SaveHost(version, tensors, user_bytes, stats, true);
  }
  FTRUN_RETURN_IF_ERROR(s);
  p.stats.stall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (stats != nullptr) *stats = p.stats;
  return Status::Ok();
}

Status Client::Impl::SendManifest(PendingSave* p) {
  Manifest& m = p->manifest;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    for (size_t j = 0; j < m.tensors[i].chunks.size(); ++j) p->fresh[i].hashes[j] = m.tensors[i].chunks[j].hash;
  }
  ByteWriter w;
  EncodeManifest(m, &w);
  std::string reply;
  FTRUN_RETURN_IF_ERROR(Call(MsgType::kSave, w.data(), MsgType::kSaveOk, &reply));
  for (size_t i = 0; i < m.tensors.size(); ++i) cache[m.tensors[i].info.name] = std::move(p->fresh[i]);
  return Status::Ok();
}

}  // namespace ftrun
