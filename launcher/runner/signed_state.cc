#include "launcher/runner/signed_state.h"

#include <openssl/crypto.h>

#include <nlohmann/json.hpp>

#include "plugin/transport/handshake.h"
#include "plugin/transport/secret.h"

namespace ftrun {
namespace {

std::string Mac(const std::string& secret, const std::string& job, const std::string& state) {
  const std::string raw = HandshakeMac(secret, "etcd-state", job + "|" + state);
  return ToHex(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
}

}  // namespace

std::string SignState(const std::string& secret, const std::string& job, const std::string& state) {
  return nlohmann::json{{"state", state}, {"mac", Mac(secret, job, state)}}.dump();
}

Status VerifyState(const std::string& secret, const std::string& secret_from, const std::string& job,
                   const std::string& value, const std::string& where, std::string* state) {
  const nlohmann::json j = nlohmann::json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("state") || !j["state"].is_string() || !j.contains("mac") ||
      !j["mac"].is_string()) {
    return Status::FailedPrecondition(where +
                                      ": expected {\"state\": \"...\", \"mac\": \"...\"}, the state the job's "
                                      "coordinator signs; this is not signed, so not taken from etcd");
  }
  const std::string text = j["state"].get<std::string>(), got = j["mac"].get<std::string>();
  const std::string want = Mac(secret, job, text);
  if (got.size() != want.size() || CRYPTO_memcmp(got.data(), want.data(), want.size()) != 0) {
    return Status::FailedPrecondition(where + ": its signature does not match the job secret in " + secret_from +
                                      ": written by someone other than the job's coordinator (or for another "
                                      "job); nothing of it is used");
  }
  *state = text;
  return Status::Ok();
}

}  // namespace ftrun
