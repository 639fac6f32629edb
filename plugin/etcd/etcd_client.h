// EtcdClient: the few etcd v3 calls a coordinator's leadership needs (a
// lease, a compare-and-create, gets and fenced puts), spoken as JSON to
// etcd's gRPC gateway (POST /v3/...) with libcurl, over http or https (CA,
// client certificate and key files).
//
// Endpoints are tried in turn: a call that cannot reach one (refused,
// timed out, an HTTP error) goes to the next, so a dead etcd member costs
// one timeout, not the call. Every answer is treated as hostile: its size
// is bounded, its JSON and base64 checked, and an error names the
// endpoint, the call and what was wrong.
//
// Blocking; one instance per thread (a libcurl easy handle is not shared).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

struct EtcdOptions {
  std::vector<std::string> endpoints;  // "http://127.0.0.1:2379", "https://..."
  std::string ca_file, cert_file, key_file;
  std::chrono::milliseconds timeout{1000};  // per call and endpoint
};

struct EtcdValue {
  std::string value;
  int64_t create_revision = 0;  // grows with every creation: a key's term
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

class EtcdClient {
 public:
  explicit EtcdClient(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // A lease of ttl_s seconds.
  Status Grant(int ttl_s, int64_t* lease);
  // Renews the lease; *ttl_left 0: it had expired (its keys are gone).
  Status KeepAlive(int64_t lease, int64_t* ttl_left);
  Status Revoke(int64_t lease);
  // Creates key = value under the lease unless the key exists; *created
  // says which, and *current is the key as it is now (ours or the holder's).
  Status CreateIfAbsent(const std::string& key, const std::string& value, int64_t lease, bool* created,
                        EtcdValue* current);
  // The key, or nullopt when it does not exist.
  Status Get(const std::string& key, std::optional<EtcdValue>* out);
  // Puts key = value (lease 0: none) only while `fence` exists with
  // create_revision `term`; *put false: it does not (a deposed leader's
  // write is refused by etcd itself).
  Status PutIfTerm(const std::string& fence, int64_t term, const std::string& key, const std::string& value,
                   int64_t lease, bool* put);

  // Deletes key only while `fence` has create_revision `term`.
  Status DeleteIfTerm(const std::string& fence, int64_t term, const std::string& key, bool* deleted);

  const std::string& endpoint() const;  // the one the last call used

 private:
  // POSTs `body` to path on the current endpoint, then the others; the
  // parsed answer's text.
  Status Call(const std::string& path, const std::string& body, std::string* answer);
  Status IfTerm(const std::string& fence, int64_t term, const std::string& op, bool* done);
  Status CallOne(const std::string& endpoint, const std::string& path, const std::string& body, std::string* answer);

  EtcdOptions o_;
  size_t current_ = 0;
  void* curl_ = nullptr;  // CURL*
};

// etcd's JSON carries keys and values in base64.
std::string Base64Encode(const std::string& bytes);
bool Base64Decode(const std::string& text, std::string* out);

}  // namespace ftrun
