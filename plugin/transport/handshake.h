// What is authenticated on an agent link, and how.
//
// 1. The handshake proves, both ways, that each side knows the job secret,
//    without sending it, and binds the proof to this one connection:
//      acceptor  -> connector: challenge = acceptor nonce (16 random bytes)
//      connector -> acceptor:  hello = connector id, connector nonce,
//                              HMAC(secret, "hello" | T)
//      acceptor  -> connector: welcome = acceptor id,
//                              HMAC(secret, "welcome" | T)
//    where the transcript T = acceptor nonce | connector nonce |
//    connector id | acceptor id (the id the connector meant to reach).
//    Both nonces are fresh, so a recorded proof is worthless later; both
//    ids are in T, so a proof made for one peer is refused by any other
//    (a process that receives one agent's connection, e.g. on a dead
//    runner's port, cannot relay that agent's hello to a third agent); the
//    role label differs per direction, so one side's proof is never the
//    other's.
// 2. Both sides then derive a session key K = HMAC(secret, "session" | T),
//    unique to this connection. Every control message after the handshake
//    carries MessageMac(K, direction, seq, type, payload); seq counts from 0
//    per direction. A message with a bad MAC or a sequence number other than
//    the next one (injected, tampered, replayed, reordered) is dropped,
//    logged with the peer's address, and the connection is closed.
// 3. Bulk data is bound to the session too (BulkHeader in session_frame.h):
//    it is only accepted from a connection that finished the handshake, for
//    a receive posted for that peer, with a header MACed under K.
//
// Primitives: HMAC-SHA256 from OpenSSL; nothing hand-rolled.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

struct evp_mac_ctx_st;  // OpenSSL's EVP_MAC_CTX

namespace ftrun {

inline constexpr size_t kNonceBytes = 16;
inline constexpr size_t kMacBytes = 32;  // HMAC-SHA256

std::string NewNonce();

// The handshake transcript: both nonces and both identities.
std::string HandshakeTranscript(const std::string& acceptor_nonce, const std::string& connector_nonce,
                                uint32_t connector, uint32_t acceptor);
// HMAC-SHA256(secret, role | transcript); role is "hello" or "welcome".
std::string HandshakeMac(const std::string& secret, const char* role, const std::string& transcript);
// The connection's session key, HMAC-SHA256(secret, "session" | transcript).
std::string SessionKey(const std::string& secret, const std::string& transcript);

// Which way a message goes: from the side that connected, or to it.
enum class Direction : uint8_t { kFromConnector = 1, kFromAcceptor = 2 };

// HMAC-SHA256 under one key, set up once: a connection MACs every message
// under its session key, and setting the key up again for each (OpenSSL's
// context and the key's pads) cost more than the MAC of a small message.
// Not thread-safe: one per connection, used by its transport's thread.
class KeyedMac {
 public:
  KeyedMac() = default;  // no key: Of() must not be called
  explicit KeyedMac(std::string_view key);
  // The MAC of the parts, concatenated (fed piecewise: nothing is copied).
  std::string Of(std::initializer_list<std::string_view> parts);

 private:
  struct Free {
    void operator()(evp_mac_ctx_st* ctx) const;
  };
  std::unique_ptr<evp_mac_ctx_st, Free> ctx_;
};

// HMAC-SHA256(key, "msg" | direction | seq | type | payload).
std::string MessageMac(KeyedMac& key, Direction dir, uint64_t seq, uint32_t type, std::string_view payload);
// HMAC-SHA256(key, "bulk" | direction | tag | length): binds a bulk send's
// header (not its bytes, which the receiver checks by content hash) to the
// session.
std::string BulkMac(KeyedMac& key, Direction dir, uint64_t tag, uint64_t length);

// Constant-time comparison.
bool MacEqual(std::string_view a, std::string_view b);

}  // namespace ftrun
