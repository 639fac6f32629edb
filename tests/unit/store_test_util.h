// A rank's save into a real SnapshotStore, for the tests of the agent's
// parts that read or free what the store holds.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "plugin/common/hash.h"
#include "plugin/store/snapshot_store.h"
#include "tests/catch.h"

namespace ftrun {

// Rank `rank` saves `version`: tensor "w" of one chunk holding `content`,
// copied to `arena` + its offset when an arena is given (else the store's
// offsets point at nothing). Same-length contents keep one layout.
inline void SaveOneChunk(SnapshotStore* store, int rank, uint64_t version, const std::string& content,
                         char* arena = nullptr) {
  std::vector<uint64_t> offs;
  REQUIRE(store->Reserve(1, {content.size()}, &offs).ok());
  if (arena != nullptr) std::memcpy(arena + offs[0], content.data(), content.size());
  Manifest m;
  m.rank = rank;
  m.version = version;
  TensorManifest t;
  ChunkRef c;
  c.hash = HashBytes(content.data(), content.size());
  c.length = content.size();
  c.offset = offs[0];
  t.chunks.push_back(c);
  t.info = {"w", DType::kUInt8, {static_cast<int64_t>(c.length)}, c.length, Device::kHost};
  m.tensors.push_back(t);
  Status s = store->AddManifest(1, std::move(m));
  INFO(s.message());
  REQUIRE(s.ok());
  store->ReleaseReservations(1);
}

// "R@V" padded to 16 bytes: a content of its own for each rank and version.
inline std::string RankVersionContent(int rank, uint64_t version) {
  std::string content = std::to_string(rank) + "@" + std::to_string(version);
  content.resize(16, '.');
  return content;
}

}  // namespace ftrun
