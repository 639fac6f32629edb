// Manifest: one rank's snapshot at one version. Tensors with their
// dtype/shape, each a list of chunk references, plus opaque user bytes (RNG
// state, data-loader position, step).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ftrun/client.h"
#include "ftrun/status.h"
#include "plugin/common/bytes.h"
#include "plugin/common/hash.h"

namespace ftrun {

inline constexpr uint64_t kNoOffset = ~0ull;

struct ChunkRef {
  ChunkHash hash;
  uint64_t length = 0;
  // Arena offset. In a rank's save request: the reserved extent it filled,
  // or kNoOffset for a chunk referenced by hash. In the store: where it is.
  uint64_t offset = kNoOffset;
};

struct TensorManifest {
  TensorInfo info;
  std::vector<ChunkRef> chunks;
};

// The largest chunk a store makes (store.chunk_size is at most this): a
// chunk length read from outside (a disk manifest) above it is corrupt.
inline constexpr uint64_t kMaxChunkSize = 1ull << 30;

// The one rule for a chunk's length: 1..`max` bytes (`max`: the job's
// store.chunk_size where the chunk is new, kMaxChunkSize where it may come
// from an earlier run's). A length sizes a store reservation and a read, so
// every way in (a rank's save, a copy, a disk manifest, the store itself)
// checks it. InvalidArgument naming `where`, the tensor, the chunk and the
// bounds.
Status CheckChunkLength(const std::string& where, const TensorManifest& t, size_t chunk, uint64_t max);

struct Manifest {
  int32_t rank = -1;
  uint64_t version = 0;
  std::string user_bytes;
  std::vector<TensorManifest> tensors;

  uint64_t state_bytes() const;
};

void EncodeManifest(const Manifest& m, ByteWriter* w);
// Checks structure and sizes: chunk lengths add up to nbytes, nbytes matches
// shape x dtype, names unique and non-empty. `what` names the source.
Status DecodeManifest(ByteReader* r, const std::string& what, Manifest* out);

// The tensor layout of a rank must not change between saves: same names in
// the same order, dtypes and shapes. The error names the first difference.
Status CheckSameLayout(const Manifest& before, const Manifest& after);

std::string ShapeString(const std::vector<int64_t>& shape);  // "[4, 1024]"

}  // namespace ftrun
