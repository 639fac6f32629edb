#include "plugin/transport/handshake.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>
#include <stdexcept>

namespace ftrun {

std::string NewNonce() {
  std::string n(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    throw std::runtime_error("RAND_bytes failed");  // no entropy: nothing sensible to do
  }
  return n;
}

std::string HandshakeMac(const std::string& secret, const char* role, const std::string& nonce, uint32_t peer) {
  std::string msg = std::string(role) + '|' + nonce + '|';
  msg.append(reinterpret_cast<const char*>(&peer), sizeof(peer));
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

bool MacEqual(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace ftrun
