// The rank <-> agent store requests (wire.h's MsgType), each as a struct with
// its Encode and a Decode that checks the payload's structure and sizes and
// says what was malformed: the rank's libftrun and the agent's StoreService
// both go through these, so neither side has a codec of its own.
// (Manifests: plugin/store/manifest.h; errors and save stalls: wire.h.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

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

std::string Encode(const AllocMsg& m);
std::string Encode(const AllocOkMsg& m);
std::string Encode(const WaitCommittedMsg& m);
std::string Encode(const ListOkMsg& m);
// Corruption naming the message when the payload is malformed or has bytes
// left over.
Status Decode(std::string_view payload, AllocMsg* out);
Status Decode(std::string_view payload, AllocOkMsg* out);
Status Decode(std::string_view payload, WaitCommittedMsg* out);
Status Decode(std::string_view payload, ListOkMsg* out);

}  // namespace ftrun
