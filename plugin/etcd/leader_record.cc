#include "plugin/etcd/leader_record.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace ftrun {

JobKeys KeysOf(const CoordinatorConfig& c, const std::string& job) {
  const std::string base = c.etcd_prefix + "/" + job + "/";
  return {base + "leader", base + "state", base + "end"};
}

EtcdOptions EtcdOptionsOf(const CoordinatorConfig& c) {
  EtcdOptions o;
  o.endpoints = c.etcd_endpoints;
  o.ca_file = c.etcd_ca_file;
  o.cert_file = c.etcd_cert_file;
  o.key_file = c.etcd_key_file;
  // A call must fit well inside the lease: a leader that cannot renew it
  // steps down before it lapses.
  o.timeout = std::min(std::chrono::milliseconds(1000), c.etcd_lease_ttl / 5);
  return o;
}

std::string EncodeLeader(const LeaderRecord& r) {
  return nlohmann::json{{"address", r.address}, {"pid", r.pid}, {"host", r.host}}.dump();
}

Status DecodeLeader(const std::string& key, const EtcdValue& v, LeaderRecord* out) {
  nlohmann::json j = nlohmann::json::parse(v.value, nullptr, false);
  auto bad = [&](const std::string& what) {
    return Status::Corruption("etcd key " + key + ": " + what + " (got " + v.value.substr(0, 120) + ")");
  };
  if (j.is_discarded() || !j.is_object()) return bad("expected a JSON object {address, pid, host}");
  if (!j.contains("address") || !j["address"].is_string() || j["address"].get<std::string>().size() > 256)
    return bad("field 'address' must be a string of at most 256 characters");
  if (!j.contains("pid") || !j["pid"].is_number_integer()) return bad("field 'pid' must be an integer");
  if (j.contains("host") && (!j["host"].is_string() || j["host"].get<std::string>().size() > 256))
    return bad("field 'host' must be a string of at most 256 characters");
  if (v.create_revision <= 0) return bad("no create_revision");
  out->address = j["address"].get<std::string>();
  out->pid = j["pid"].get<int64_t>();
  out->host = j.value("host", std::string());
  out->term = v.create_revision;
  return Status::Ok();
}

}  // namespace ftrun
