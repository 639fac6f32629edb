// The connection handshake that proves both sides know the job secret,
// without sending it: the acceptor sends a random challenge, the connector
// answers HMAC-SHA256(secret, "hello" | challenge | its id), the acceptor
// answers HMAC-SHA256(secret, "welcome" | connector's nonce | its id).
// Fresh nonces on both sides: a recorded answer cannot be replayed.
#pragma once

#include <cstdint>
#include <string>

namespace ftrun {

inline constexpr size_t kNonceBytes = 16;

std::string NewNonce();
// HMAC-SHA256 over role | nonce | peer id, keyed by the secret.
std::string HandshakeMac(const std::string& secret, const char* role, const std::string& nonce, uint32_t peer);
// Constant-time comparison.
bool MacEqual(const std::string& a, const std::string& b);

}  // namespace ftrun
