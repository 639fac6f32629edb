// The framing of an agent link after its handshake (handshake.h): the
// header of every control message and of every bulk send, MACed under the
// connection's session key. Plain data and plain functions; no UCX here, so
// the rules are unit-tested on their own (tests/unit/session_frame_test.cc).
//
// Thread-safety: a SessionFrames belongs to one connection and is used only
// by the thread that owns it (the transport's progress thread).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ftrun/status.h"
#include "plugin/transport/handshake.h"

namespace ftrun {

// Handshake message types, above every application type.
inline constexpr uint16_t kChallenge = 0xFF01;  // acceptor -> connector: nonce
inline constexpr uint16_t kHello = 0xFF02;      // connector -> acceptor: id, nonce, mac
inline constexpr uint16_t kWelcome = 0xFF03;    // acceptor -> connector: id, mac

// The header of every control message. Handshake messages carry seq 0 and
// no MAC (their payload is the proof); every later one carries
// MessageMac(session key, direction, seq, type, payload) (handshake.h).
struct WireHeader {
  uint32_t type;
  uint32_t reserved;
  uint64_t seq;
  char mac[kMacBytes];
};
static_assert(std::is_trivially_copyable_v<WireHeader>);

// The header of a bulk send: the receiver's tag and BulkMac(session key,
// direction, tag, length).
//
// Why bulk is an active message and not a tag send: a tag receive is posted
// on the whole worker and matches any sender's tag, so a connection that
// never authenticated could pre-send tags (they wait in the worker's
// unexpected queue, unbounded) and have its bytes land in a later transfer.
// An active message arrives with the endpoint it came from, so the handler
// accepts it only from a connection that finished the handshake, only for a
// receive posted for that connection's peer and tag, and only with a header
// MACed under that connection's session key; anything else is dropped on the
// spot (an eager payload is released when the handler returns, a rendezvous
// one is never fetched), so nothing is buffered for it. The bytes themselves
// are not MACed (the replicator checks every chunk's content hash); the
// header MAC binds them to the session, so another connection's bytes are
// never accepted. No tag receive is ever posted: every tag send that reaches
// us is an outsider's, and DrainTags drops it (ucx_bulk.cc).
struct BulkHeader {
  uint64_t tag;
  char mac[kMacBytes];
};
static_assert(std::is_trivially_copyable_v<BulkHeader>);

// One connection's session: its key, which way it sends, and the next
// sequence number each way (counted from 0 per direction).
class SessionFrames {
 public:
  SessionFrames() = default;  // no session yet (the handshake is not done)
  // `connector`: this side made the connection.
  SessionFrames(const std::string& key, bool connector)
      : key_(key),
        sending_(connector ? Direction::kFromConnector : Direction::kFromAcceptor),
        receiving_(connector ? Direction::kFromAcceptor : Direction::kFromConnector) {}

  // The header for the next control message (type below kChallenge): the
  // next send sequence number and its MAC.
  WireHeader SealMessage(uint16_t type, std::string_view payload);
  // Accepts a received control message only if it is not a handshake type,
  // its MAC matches the session key, and its number is the next one; then
  // counts it. Otherwise FailedPrecondition saying what was refused (forged,
  // tampered, replayed or reordered), and nothing is counted.
  Status OpenMessage(const WireHeader& h, std::string_view payload);

  BulkHeader SealBulk(uint64_t tag, uint64_t length);
  // Whether a received bulk header was MACed under this session for
  // `length` bytes.
  bool OpenBulk(const BulkHeader& h, uint64_t length);

 private:
  KeyedMac key_;
  Direction sending_ = Direction::kFromConnector;
  Direction receiving_ = Direction::kFromAcceptor;
  uint64_t send_seq_ = 0, recv_seq_ = 0;  // next control message sequence numbers, per direction
};

}  // namespace ftrun
