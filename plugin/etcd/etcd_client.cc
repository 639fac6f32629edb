#include "plugin/etcd/etcd_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>

namespace ftrun {

namespace {

constexpr size_t kMaxAnswer = 4u << 20;  // etcd's own request limit is 1.5 MiB

using Json = nlohmann::json;

size_t Collect(char* data, size_t size, size_t n, void* user) {
  auto* out = static_cast<std::string*>(user);
  if (out->size() + size * n > kMaxAnswer) return 0;  // curl fails the call: CURLE_WRITE_ERROR
  out->append(data, size * n);
  return size * n;
}

// proto3's JSON: int64 as a string, a zero value left out.
Status Int64(const Json& j, const char* name, int64_t* out) {
  *out = 0;
  if (!j.is_object() || !j.contains(name)) return Status::Ok();
  const Json& v = j[name];
  if (v.is_number_integer()) return *out = v.get<int64_t>(), Status::Ok();
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    errno = 0;
    char* end = nullptr;
    long long n = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end == s.c_str() + s.size() && errno == 0) return *out = n, Status::Ok();
  }
  return Status::Corruption(std::string("field '") + name + "' is not an int64: " + v.dump().substr(0, 64));
}

Status ParseKv(const Json& kv, EtcdValue* out) {
  if (!kv.is_object()) return Status::Corruption("a key-value is not an object");
  if (kv.contains("value") && (!kv["value"].is_string() || !Base64Decode(kv["value"].get<std::string>(), &out->value)))
    return Status::Corruption("field 'value' is not base64");
  FTRUN_RETURN_IF_ERROR(Int64(kv, "create_revision", &out->create_revision));
  FTRUN_RETURN_IF_ERROR(Int64(kv, "mod_revision", &out->mod_revision));
  return Int64(kv, "lease", &out->lease);
}

// The first kvs entry of a range answer, if any.
Status FirstKv(const Json& range, std::optional<EtcdValue>* out) {
  out->reset();
  if (!range.is_object() || !range.contains("kvs")) return Status::Ok();
  if (!range["kvs"].is_array()) return Status::Corruption("field 'kvs' is not a list");
  if (range["kvs"].empty()) return Status::Ok();
  EtcdValue v;
  FTRUN_RETURN_IF_ERROR(ParseKv(range["kvs"][0], &v));
  *out = std::move(v);
  return Status::Ok();
}

Json Put(const std::string& key, const std::string& value, int64_t lease) {
  Json p = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) p["lease"] = std::to_string(lease);
  return {{"request_put", p}};
}

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

std::string Base64Encode(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

bool Base64Decode(const std::string& text, std::string* out) {
  if (text.size() % 4 != 0) return false;
  std::string buf(3 * (text.size() / 4), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(buf.data()),
                                reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0) return false;
  size_t pad = 0;
  if (!text.empty() && text.back() == '=') pad = text.size() >= 2 && text[text.size() - 2] == '=' ? 2 : 1;
  buf.resize(static_cast<size_t>(n) - pad);
  *out = std::move(buf);
  return true;
}

EtcdClient::EtcdClient(EtcdOptions options) : o_(std::move(options)) {
  InitCurlOnce();
  curl_ = curl_easy_init();
}

EtcdClient::~EtcdClient() {
  if (curl_ != nullptr) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

const std::string& EtcdClient::endpoint() const {
  static const std::string kNone = "(no endpoint)";
  return o_.endpoints.empty() ? kNone : o_.endpoints[current_ % o_.endpoints.size()];
}

Status EtcdClient::CallOne(const std::string& endpoint, const std::string& path, const std::string& body,
                           std::string* answer) {
  CURL* c = static_cast<CURL*>(curl_);
  if (c == nullptr) return Status::Unavailable("libcurl could not start");
  curl_easy_reset(c);
  const std::string url = endpoint + path;
  answer->clear();
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, answer);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(o_.timeout.count()));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(o_.timeout.count()));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  if (!o_.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, o_.ca_file.c_str());
  if (!o_.cert_file.empty()) curl_easy_setopt(c, CURLOPT_SSLCERT, o_.cert_file.c_str());
  if (!o_.key_file.empty()) curl_easy_setopt(c, CURLOPT_SSLKEY, o_.key_file.c_str());
  const CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) return Status::Unavailable(url + ": " + curl_easy_strerror(rc));
  long http = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
  if (http != 200) {
    return Status::Unavailable(url + ": HTTP " + std::to_string(http) + ": " + answer->substr(0, 300));
  }
  return Status::Ok();
}

Status EtcdClient::Call(const std::string& path, const std::string& body, std::string* answer) {
  if (o_.endpoints.empty()) return Status::InvalidArgument("no etcd endpoints");
  Status last;
  for (size_t i = 0; i < o_.endpoints.size(); ++i) {
    const std::string& e = o_.endpoints[current_ % o_.endpoints.size()];
    last = CallOne(e, path, body, answer);
    if (last.ok()) return last;
    current_ = (current_ + 1) % o_.endpoints.size();  // the next one, from now on
  }
  return Status::Unavailable("no etcd endpoint answered " + path + " (last: " + last.message() + ")");
}

namespace {

Status Parse(const std::string& endpoint, const std::string& path, const std::string& text, Json* out) {
  *out = Json::parse(text, nullptr, false);
  if (out->is_discarded() || !out->is_object()) {
    return Status::Corruption(endpoint + path + ": the answer is not a JSON object: " + text.substr(0, 200));
  }
  if (out->contains("error")) {
    return Status::Unavailable(endpoint + path + ": etcd says " + (*out)["error"].dump().substr(0, 300));
  }
  return Status::Ok();
}

bool Succeeded(const Json& txn) { return txn.contains("succeeded") && txn["succeeded"] == true; }

}  // namespace

Status EtcdClient::Grant(int ttl_s, int64_t* lease) {
  std::string text;
  Json j;
  FTRUN_RETURN_IF_ERROR(Call("/v3/lease/grant", Json{{"TTL", ttl_s}}.dump(), &text));
  FTRUN_RETURN_IF_ERROR(Parse(endpoint(), "/v3/lease/grant", text, &j));
  FTRUN_RETURN_IF_ERROR(Int64(j, "ID", lease));
  if (*lease == 0) return Status::Corruption(endpoint() + "/v3/lease/grant: no lease ID in " + text.substr(0, 200));
  return Status::Ok();
}

Status EtcdClient::KeepAlive(int64_t lease, int64_t* ttl_left) {
  std::string text;
  Json j;
  FTRUN_RETURN_IF_ERROR(Call("/v3/lease/keepalive", Json{{"ID", std::to_string(lease)}}.dump(), &text));
  // A stream's answer: one JSON object a line, {"result": {...}}.
  FTRUN_RETURN_IF_ERROR(Parse(endpoint(), "/v3/lease/keepalive", text.substr(0, text.find('\n')), &j));
  if (!j.contains("result")) return Status::Corruption(endpoint() + "/v3/lease/keepalive: no 'result'");
  return Int64(j["result"], "TTL", ttl_left);
}

Status EtcdClient::Revoke(int64_t lease) {
  std::string text;
  Json j;
  FTRUN_RETURN_IF_ERROR(Call("/v3/lease/revoke", Json{{"ID", std::to_string(lease)}}.dump(), &text));
  return Parse(endpoint(), "/v3/lease/revoke", text, &j);
}

Status EtcdClient::Get(const std::string& key, std::optional<EtcdValue>* out) {
  std::string text;
  Json j;
  FTRUN_RETURN_IF_ERROR(Call("/v3/kv/range", Json{{"key", Base64Encode(key)}}.dump(), &text));
  FTRUN_RETURN_IF_ERROR(Parse(endpoint(), "/v3/kv/range", text, &j));
  Status s = FirstKv(j, out);
  return s.ok() ? s : Status::Corruption(endpoint() + "/v3/kv/range " + key + ": " + s.message());
}

Status EtcdClient::CreateIfAbsent(const std::string& key, const std::string& value, int64_t lease, bool* created,
                                  EtcdValue* current) {
  const std::string k = Base64Encode(key);
  Json txn = {{"compare", Json::array({{{"key", k}, {"target", "CREATE"}, {"create_revision", "0"}}})},
              {"success", Json::array({Put(key, value, lease), {{"request_range", {{"key", k}}}}})},
              {"failure", Json::array({{{"request_range", {{"key", k}}}}})}};
  std::string text;
  Json j;
  FTRUN_RETURN_IF_ERROR(Call("/v3/kv/txn", txn.dump(), &text));
  FTRUN_RETURN_IF_ERROR(Parse(endpoint(), "/v3/kv/txn", text, &j));
  *created = Succeeded(j);
  const Json& rs = j.contains("responses") ? j["responses"] : Json();
  std::optional<EtcdValue> now;
  if (rs.is_array() && !rs.empty() && rs.back().is_object() && rs.back().contains("response_range")) {
    Status s = FirstKv(rs.back()["response_range"], &now);
    if (!s.ok()) return Status::Corruption(endpoint() + "/v3/kv/txn " + key + ": " + s.message());
  }
  if (!now)
    return Status::Unavailable(endpoint() + "/v3/kv/txn " + key + ": the key vanished at once (a lease lapse?)");
  *current = std::move(*now);
  return Status::Ok();
}

Status EtcdClient::IfTerm(const std::string& fence, int64_t term, const std::string& op, bool* done) {
  Json txn = {
      {"compare",
       Json::array({{{"key", Base64Encode(fence)}, {"target", "CREATE"}, {"create_revision", std::to_string(term)}}})},
      {"success", Json::array({Json::parse(op)})}};
  std::string text;
  Json j;
  FTRUN_RETURN_IF_ERROR(Call("/v3/kv/txn", txn.dump(), &text));
  FTRUN_RETURN_IF_ERROR(Parse(endpoint(), "/v3/kv/txn", text, &j));
  *done = Succeeded(j);
  return Status::Ok();
}

Status EtcdClient::PutIfTerm(const std::string& fence, int64_t term, const std::string& key, const std::string& value,
                             int64_t lease, bool* put) {
  return IfTerm(fence, term, Put(key, value, lease).dump(), put);
}

Status EtcdClient::DeleteIfTerm(const std::string& fence, int64_t term, const std::string& key, bool* deleted) {
  return IfTerm(fence, term, Json{{"request_delete_range", {{"key", Base64Encode(key)}}}}.dump(), deleted);
}

}  // namespace ftrun
