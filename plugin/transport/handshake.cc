#include "plugin/transport/handshake.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <cstring>
#include <initializer_list>
#include <stdexcept>

namespace ftrun {
namespace {

template <typename T>
std::string_view Raw(const T& v) {
  return {reinterpret_cast<const char*>(&v), sizeof(v)};
}

std::string Hmac(std::string_view key, std::initializer_list<std::string_view> parts) {
  return KeyedMac(key).Of(parts);
}

}  // namespace

void KeyedMac::Free::operator()(evp_mac_ctx_st* ctx) const { EVP_MAC_CTX_free(ctx); }

KeyedMac::KeyedMac(std::string_view key) {
  // Fetched once; EVP_MAC objects may be shared between threads.
  static EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  ctx_.reset(mac ? EVP_MAC_CTX_new(mac) : nullptr);
  if (ctx_ == nullptr)
    throw std::runtime_error("OpenSSL HMAC unavailable");  // a broken install: nothing sensible to do
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  if (EVP_MAC_init(ctx_.get(), reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) != 1) {
    throw std::runtime_error("OpenSSL HMAC key set-up failed");
  }
}

std::string KeyedMac::Of(std::initializer_list<std::string_view> parts) {
  if (ctx_ == nullptr) throw std::logic_error("a MAC asked of a KeyedMac with no key");
  std::string out(kMacBytes, '\0');
  size_t len = 0;
  // A null key starts a new MAC under the key already set (OpenSSL 3's HMAC).
  bool ok = EVP_MAC_init(ctx_.get(), nullptr, 0, nullptr) == 1;
  for (std::string_view p : parts) {
    ok = ok && EVP_MAC_update(ctx_.get(), reinterpret_cast<const unsigned char*>(p.data()), p.size()) == 1;
  }
  ok = ok && EVP_MAC_final(ctx_.get(), reinterpret_cast<unsigned char*>(out.data()), &len, out.size()) == 1;
  if (!ok || len != kMacBytes) throw std::runtime_error("OpenSSL HMAC failed");
  return out;
}

std::string NewNonce() {
  std::string n(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    throw std::runtime_error("RAND_bytes failed");  // no entropy: nothing sensible to do
  }
  return n;
}

std::string HandshakeTranscript(const std::string& acceptor_nonce, const std::string& connector_nonce,
                                uint32_t connector, uint32_t acceptor) {
  // Fixed-size fields (the nonces are checked to be kNonceBytes by the
  // caller), so the concatenation is unambiguous.
  std::string t = "ftrun-link-v2|";
  t += acceptor_nonce;
  t += connector_nonce;
  t += Raw(connector);
  t += Raw(acceptor);
  return t;
}

std::string HandshakeMac(const std::string& secret, const char* role, const std::string& transcript) {
  return Hmac(secret, {role, "|", transcript});
}

std::string SessionKey(const std::string& secret, const std::string& transcript) {
  return Hmac(secret, {"session|", transcript});
}

std::string MessageMac(KeyedMac& key, Direction dir, uint64_t seq, uint32_t type, std::string_view payload) {
  return key.Of({"msg|", Raw(dir), Raw(seq), Raw(type), payload});
}

std::string BulkMac(KeyedMac& key, Direction dir, uint64_t tag, uint64_t length) {
  return key.Of({"bulk|", Raw(dir), Raw(tag), Raw(length)});
}

bool MacEqual(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace ftrun
