#include "plugin/erasure/node_shard.h"

#include <algorithm>
#include <string>

namespace ftrun {

NodeShard::NodeShard(const std::vector<const Manifest*>& ranks) {
  for (const Manifest* m : ranks) {
    for (const TensorManifest& t : m->tensors) {
      for (const ChunkRef& c : t.chunks) {
        chunks_.push_back({size_, &c});
        size_ += c.length;
      }
    }
  }
}

bool NodeShard::SameLayout(const NodeShard& o) const {
  if (size_ != o.size_ || chunks_.size() != o.chunks_.size()) return false;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    if (chunks_[i].ref->length != o.chunks_[i].ref->length) return false;
  }
  return true;
}

uint64_t NodeShard::SliceLength(int data) const {
  const uint64_t d = static_cast<uint64_t>(std::max(1, data));
  return std::max<uint64_t>(1, (size_ + d - 1) / d);
}

Status PlanDeltas(const GroupCode& code, int member, const NodeShard& now, const NodeShard* base,
                  std::vector<std::vector<DeltaPiece>>* by_stripe) {
  if (base && !now.SameLayout(*base)) {
    return Status::InvalidArgument("erasure delta: the node's shard changed layout (" + std::to_string(base->size()) +
                                   " bytes in " + std::to_string(base->chunks().size()) + " chunks, now " +
                                   std::to_string(now.size()) + " in " + std::to_string(now.chunks().size()) + ")");
  }
  by_stripe->assign(static_cast<size_t>(code.members()), {});
  const uint64_t slice = now.SliceLength(code.data());
  for (size_t i = 0; i < now.chunks().size(); ++i) {
    const NodeShard::Chunk& c = now.chunks()[i];
    if (base && base->chunks()[i].ref->hash == c.ref->hash) continue;
    for (uint64_t off = 0; off < c.ref->length;) {
      const GroupCode::Place place = code.Locate(member, c.at + off, slice);
      const uint64_t len = std::min(c.ref->length - off, slice - place.offset);
      (*by_stripe)[static_cast<size_t>(place.stripe)].push_back({i, off, len, place});
      off += len;
    }
  }
  return Status::Ok();
}

}  // namespace ftrun
