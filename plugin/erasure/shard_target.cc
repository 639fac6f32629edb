#include "plugin/erasure/shard_target.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <unordered_set>

#include "plugin/common/hash.h"

namespace ftrun {

Status ShardTarget::Reserve(const NodeShard* shard) {
  Release();
  shard_ = shard;
  std::unordered_set<ChunkHash, ChunkHashHasher> seen;
  std::vector<uint64_t> lengths;
  std::vector<size_t> written;
  target_.assign(shard_->chunks().size(), kNoOffset);
  reserved_ = true;
  for (size_t i = 0; i < shard_->chunks().size(); ++i) {
    const ChunkRef& c = *shard_->chunks()[i].ref;
    if (!seen.insert(c.hash).second || store_->HoldChunk(owner_, c.hash)) continue;
    lengths.push_back(c.length);
    written.push_back(i);
  }
  std::vector<uint64_t> offsets;
  if (Status s = store_->Reserve(owner_, lengths, &offsets); !s.ok()) return s;
  for (size_t i = 0; i < written.size(); ++i) target_[written[i]] = offsets[i];
  return Status::Ok();
}

void ShardTarget::Extents(uint64_t at, uint64_t length,
                          const std::function<void(uint8_t*, uint64_t, uint64_t)>& put) const {
  const uint64_t to = std::min(at + length, shard_->size());
  const auto& chunks = shard_->chunks();
  auto c = std::upper_bound(chunks.begin(), chunks.end(), at,
                            [](uint64_t x, const NodeShard::Chunk& chunk) { return x < chunk.at; });
  if (c != chunks.begin()) --c;
  for (; c != chunks.end() && c->at < to; ++c) {
    const uint64_t target = target_[static_cast<size_t>(c - chunks.begin())];
    const uint64_t a = std::max(at, c->at), b = std::min(to, c->at + c->ref->length);
    if (target != kNoOffset && a < b) put(reinterpret_cast<uint8_t*>(base_ + target + (a - c->at)), a - at, b - a);
  }
}

std::vector<std::pair<uint64_t, uint64_t>> ShardTarget::Check(std::string* first_bad) const {
  std::vector<std::pair<uint64_t, uint64_t>> bad;
  const auto& chunks = shard_->chunks();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const NodeShard::Chunk& c = chunks[i];
    if (target_[i] == kNoOffset || HashBytes(base_ + target_[i], c.ref->length) == c.ref->hash) continue;
    if (bad.empty()) *first_bad = c.ref->hash.ToHex();
    bad.emplace_back(c.at, c.at + c.ref->length);
  }
  return bad;
}

Status ShardTarget::Commit(std::vector<Manifest>* manifests) {
  std::map<const ChunkRef*, uint64_t> where;
  for (size_t i = 0; i < shard_->chunks().size(); ++i) where[shard_->chunks()[i].ref] = target_[i];
  std::set<const Manifest*> kept;  // ranks the store still holds at the version
  for (const Manifest& m : *manifests) {
    if (store_->Find(m.rank, m.version)) kept.insert(&m);
  }
  for (Manifest& m : *manifests) {
    for (TensorManifest& t : m.tensors) {
      for (ChunkRef& c : t.chunks) c.offset = where.at(&c);
    }
  }
  Status s;
  for (const Manifest& m : *manifests) {
    if (s.ok() && !kept.count(&m)) s = store_->AddManifest(owner_, m);
  }
  Release();
  return s;
}

void ShardTarget::Release() {
  if (reserved_) store_->ReleaseReservations(owner_);
  reserved_ = false;
  target_.clear();
  shard_ = nullptr;
}

}  // namespace ftrun
