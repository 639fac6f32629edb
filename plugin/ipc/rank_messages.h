// The rank <-> agent messages (wire.h's MsgType), each as a struct with its
// Encode and a Decode that checks the payload's structure and sizes and says
// what was malformed: the rank's libftrun and the agent (its hello check,
// StoreService, corrupt-chunk reports) both go through these, so neither side
// has a codec of its own. (Manifests: plugin/store/manifest.h; errors and save
// stalls: wire.h; the warm control link: plugin/protocol/warm_fields.h.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ftrun/status.h"
#include "plugin/common/hash.h"

namespace ftrun {

// Who connects (kHello): the rank's own process (one connection), or a
// writer of the rank: another process of the rank's process group that saves
// versions for it beside the rank's connection (DCP's process checkpointer:
// dcp.async_save's background process). A writer may save and list versions,
// nothing else. A hello without the role byte (an older client) is the rank's.
enum class HelloRole : uint8_t { kRank = 0, kWriter = 1 };

// kHello: who the rank says it is (the agent trusts SO_PEERCRED, never the
// pid written here: launcher/agent/rank_hello.h).
struct RankHello {
  uint32_t protocol = 0;
  int32_t rank = -1;
  int32_t pid = 0;
  std::string job;  // "" when the rank does not know its job
  HelloRole role = HelloRole::kRank;
  static Status Decode(std::string_view payload, RankHello* out);
};

// kHelloOk: the job, the node, the chunk size, and the version the rank
// restores (none: a fresh start). The store's memfd goes with it.
struct HelloOkMsg {
  std::string job_id;
  int32_t node = 0;
  uint64_t chunk_size = 0;
  std::optional<uint64_t> restore_version;
};

// kSaveOk: the version saved, and the last committed one (if any).
struct SaveOkMsg {
  uint64_t version = 0;
  std::optional<uint64_t> committed;
};

// kLoad (the version, or ~0: the last committed), kLoadDone (unpin it),
// kCommitted (the committed version a wait ends with), kProgress (the step).
struct VersionMsg {
  uint64_t version = 0;
};

// kCorruptChunk: a chunk of a loaded version whose bytes hashed to `seen`.
struct CorruptChunkReport {
  uint64_t version = 0;
  std::string tensor;
  uint64_t index = 0;  // the chunk's index in the tensor
  ChunkHash seen;      // what the rank's read of its bytes hashed to
  static Status Decode(std::string_view payload, CorruptChunkReport* out);
};

// kAlloc: reserve store extents for the chunks of `version` this save adds.
struct AllocMsg {
  uint64_t version = 0;
  bool first = false;  // the first reservation of this save attempt (an abandoned one's go)
  std::vector<uint64_t> lengths;
};

// kAllocOk: one offset in the store per length asked for, in order.
struct AllocOkMsg {
  std::vector<uint64_t> offsets;
};

// kWaitCommitted: answer once `version` (or a newer one) is committed, or
// with an error after timeout_ms (< 0: no timeout).
struct WaitCommittedMsg {
  uint64_t version = 0;
  int32_t timeout_ms = -1;
};

// kListOk: the rank's versions in the store, and the committed one.
struct ListOkMsg {
  std::vector<uint64_t> committed;  // its versions at or below the committed one
  std::vector<uint64_t> pending;    // its newer ones
  bool has_committed = false;
  uint64_t committed_version = 0;
};

std::string Encode(const RankHello& m);
std::string Encode(const HelloOkMsg& m);
std::string Encode(const SaveOkMsg& m);
std::string Encode(const VersionMsg& m);
std::string Encode(const CorruptChunkReport& m);
std::string Encode(const AllocMsg& m);
std::string Encode(const AllocOkMsg& m);
std::string Encode(const WaitCommittedMsg& m);
std::string Encode(const ListOkMsg& m);
// Corruption naming the message when the payload is malformed or has bytes
// left over.
Status Decode(std::string_view payload, HelloOkMsg* out);
Status Decode(std::string_view payload, SaveOkMsg* out);
// `what` names the request in the error ("load request").
Status Decode(std::string_view payload, VersionMsg* out, const char* what);
Status Decode(std::string_view payload, AllocMsg* out);
Status Decode(std::string_view payload, AllocOkMsg* out);
Status Decode(std::string_view payload, WaitCommittedMsg* out);
Status Decode(std::string_view payload, ListOkMsg* out);

}  // namespace ftrun
