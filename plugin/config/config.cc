#include "plugin/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "plugin/common/file.h"
#include "plugin/config/config_keys.h"
#include "plugin/config/units.h"

namespace ftrun {

using namespace config_keys;

namespace {

std::string Describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar:
      return Quote(n.Scalar());
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    default:
      return "nothing";
  }
}

SourceLoc LocOf(const std::string& file, const YAML::Mark& m) {
  SourceLoc loc{file, 0, 0};
  if (m.line >= 0) loc.line = m.line + 1;
  if (m.column >= 0) loc.column = m.column + 1;
  return loc;
}

Status Error(const SourceLoc& loc, const std::string& field, const std::string& msg) {
  return Status::InvalidArgument(FormatLoc(loc, field) + ": " + msg);
}

// A nested map's entries (cluster.redundancy's), by key name.
struct Entry {
  YAML::Node value;
  SourceLoc loc;  // the key's
};
using Entries = std::map<std::string, Entry>;

// Reads `map` under `field`: each key one of `known`, once.
Status ReadEntries(const std::string& file, const std::string& field, const YAML::Node& map,
                   const std::vector<std::string>& known, Entries* out) {
  std::string list;
  for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
  for (const auto& kv : map) {
    SourceLoc loc = LocOf(file, kv.first.Mark());
    if (!kv.first.IsScalar()) return Error(loc, field, "expected plain key names, got " + Describe(kv.first));
    const std::string& name = kv.first.Scalar();
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return Error(loc, field + "." + name, "unknown key (known: " + list + ")");
    }
    if (!out->emplace(name, Entry{kv.second, loc}).second) return Error(loc, field + "." + name, "duplicate key");
  }
  return Status::Ok();
}

Status ReadInt(const Entry& e, const std::string& field, int lo, int hi, const std::string& want, int* out) {
  int v = 0;
  if (!e.value.IsScalar() || !ParseInt(e.value.Scalar(), "", &v).ok() || v < lo || v > hi) {
    return Error(e.loc, field, "expected " + want + ", got " + Describe(e.value));
  }
  *out = v;
  return Status::Ok();
}

Status ParseErasure(const std::string& file, const Entry& e, ClusterConfig* k) {
  const std::string field = "cluster.redundancy.erasure";
  if (!e.value.IsMap()) return Error(e.loc, field, "expected a map {data: D, parity: P}, got " + Describe(e.value));
  Entries f;
  FTRUN_RETURN_IF_ERROR(ReadEntries(file, field, e.value, {"data", "parity"}, &f));
  for (const char* need : {"data", "parity"}) {
    if (f.count(need) == 0) {
      return Error(e.loc, field,
                   std::string("expected data and parity, like {data: 4, parity: 2}; ") + need + " is missing");
    }
  }
  // The bounds are the Reed-Solomon code's (ErasureConfig, plugin/erasure/reed_solomon.h).
  ErasureConfig code;
  FTRUN_RETURN_IF_ERROR(ReadInt(
      f.at("data"), field + ".data", 1, ErasureConfig::kMaxData,
      "an integer from 1 to " + std::to_string(ErasureConfig::kMaxData) + " (the data nodes of a group)", &code.data));
  FTRUN_RETURN_IF_ERROR(ReadInt(f.at("parity"), field + ".parity", 1, ErasureConfig::kMaxParity,
                                "an integer from 1 to " + std::to_string(ErasureConfig::kMaxParity) +
                                    " (the parity nodes of a group: how many it can lose)",
                                &code.parity));
  k->erasure = code;
  k->replicas = 0;  // the code replaces the copies
  return Status::Ok();
}

// cluster.redundancy, the one map-valued key: {erasure: {data: D, parity:
// P}} or {replicas: K}.
Status ParseRedundancy(const std::string& file, const SourceLoc& loc, const YAML::Node& v, ClusterConfig* k) {
  const std::string field = "cluster.redundancy";
  if (!v.IsMap()) {
    return Error(loc, field,
                 std::string("expected ") + FindKey("cluster", "redundancy")->what + ", got " + Describe(v));
  }
  Entries kinds;
  FTRUN_RETURN_IF_ERROR(ReadEntries(file, field, v, {"erasure", "replicas"}, &kinds));
  if (kinds.size() != 1) {
    return Error(loc, field,
                 std::string("expected exactly one of erasure: {data: D, parity: P} or replicas: K, got ") +
                     (kinds.empty() ? "neither" : "both"));
  }
  k->redundancy_loc = loc;
  if (kinds.count("erasure")) return ParseErasure(file, kinds.at("erasure"), k);
  k->erasure = ErasureConfig{};
  return ReadInt(kinds.at("replicas"), field + ".replicas", 0, INT_MAX, "an integer >= 0", &k->replicas);
}

// cluster.replicas and cluster.redundancy say one thing two ways: a file
// sets one, else which one wins would hang on the order of its keys.
Status CheckOneRedundancy(const std::map<std::string, int>& lines, const SourceLoc& loc, const std::string& name) {
  const char* other = name == "replicas" ? "redundancy" : name == "redundancy" ? "replicas" : nullptr;
  auto it = other != nullptr ? lines.find(other) : lines.end();
  if (it == lines.end()) return Status::Ok();
  return Error(loc, "cluster." + name,
               "set together with cluster." + std::string(other) + " (line " + std::to_string(it->second) +
                   "); keep one (cluster.redundancy: {replicas: K} is cluster.replicas: K)");
}

Status ParseSection(const std::string& file, const std::string& section, const YAML::Node& map, Config* c) {
  std::map<std::string, int> seen;  // key -> its line
  for (const auto& kv : map) {
    SourceLoc loc = LocOf(file, kv.first.Mark());
    if (!kv.first.IsScalar()) return Error(loc, section, "expected plain key names, got " + Describe(kv.first));
    std::string field = section + "." + kv.first.Scalar();
    const Key* key = FindKey(section, kv.first.Scalar());
    if (key == nullptr) return Error(loc, field, "unknown key (known: " + KnownKeys(section) + ")");
    if (!seen.emplace(key->name, loc.line).second) return Error(loc, field, "duplicate key");
    if (section == "cluster") FTRUN_RETURN_IF_ERROR(CheckOneRedundancy(seen, loc, key->name));
    if (key->set == nullptr) {
      FTRUN_RETURN_IF_ERROR(ParseRedundancy(file, loc, kv.second, &c->cluster));
      continue;
    }
    if (!kv.second.IsScalar()) {
      return Error(loc, field, std::string("expected ") + key->what + ", got " + Describe(kv.second));
    }
    const std::string& text = kv.second.Scalar();
    Status st = key->set(text, c);
    if (!st.ok()) return Error(loc, field, st.message());
    if (const char* expected = key->check ? key->check(*c) : nullptr) {
      return Error(loc, field, std::string("expected ") + expected + ", got " + Quote(text));
    }
    if (field == "store.memory_budget") c->store.memory_budget_loc = loc;
    if (field == "persist.dir") c->persist.dir_loc = loc;
    if (field == "cluster.replicas") c->cluster.redundancy_loc = loc;
  }
  return Status::Ok();
}

Status ParseDocument(const std::string& file, const std::string& yaml_text, Config* c) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(yaml_text);
  } catch (const YAML::Exception& e) {
    SourceLoc loc = LocOf(file, e.mark);
    std::string where = loc.line > 0 ? file + ":" + std::to_string(loc.line) + ":" + std::to_string(loc.column) : file;
    return Status::InvalidArgument(where + ": YAML syntax error: " + e.msg);
  }
  if (docs.empty()) return Status::Ok();  // empty file: all defaults
  if (docs.size() > 1) {
    return Error(LocOf(file, docs[1].Mark()), "", "expected one YAML document, found " + std::to_string(docs.size()));
  }
  const YAML::Node& root = docs[0];
  if (root.IsNull()) return Status::Ok();
  if (!root.IsMap()) {
    return Error(LocOf(file, root.Mark()), "",
                 "expected a map with sections " + SectionList() + ", got " + Describe(root));
  }
  std::set<std::string> seen;
  for (const auto& kv : root) {
    SourceLoc loc = LocOf(file, kv.first.Mark());
    if (!kv.first.IsScalar()) return Error(loc, "", "expected section names, got " + Describe(kv.first));
    const std::string& name = kv.first.Scalar();
    if (!IsSection(name)) return Error(loc, name, "unknown key (known: " + SectionList() + ")");
    if (!seen.insert(name).second) return Error(loc, name, "duplicate key");
    if (kv.second.IsNull()) continue;  // "job:" with nothing under it
    if (!kv.second.IsMap()) {
      return Error(loc, name,
                   "expected a map of " + name + " settings (" + KnownKeys(name) + "), got " + Describe(kv.second));
    }
    FTRUN_RETURN_IF_ERROR(ParseSection(file, name, kv.second, c));
  }
  return Status::Ok();
}

// 2 x ranks x snapshot x num / den bytes, rounded up; UINT64_MAX when it
// overflows.
uint64_t Need(const Config& c, uint64_t num, uint64_t den) {
  const uint64_t per_byte = 2ull * static_cast<uint64_t>(c.agent.ranks_per_node) * num;
  if (per_byte == 0) return 0;
  if (c.store.snapshot_bytes > (UINT64_MAX - den) / per_byte) return UINT64_MAX;
  return (per_byte * c.store.snapshot_bytes + den - 1) / den;
}

// A node keeps its ranks' snapshots and the redundancy it holds for others,
// each plus one in flight: 1 + replicas full copies, or with erasure its
// parity slices, parity/data of its own state.
Status CheckClusterBudget(const Config& c) {
  const StoreConfig& s = c.store;
  const ClusterConfig& k = c.cluster;
  const std::string ranks = std::to_string(c.agent.ranks_per_node);
  if (s.snapshot_bytes == 0) return Status::Ok();
  if (!k.erasure.enabled()) {
    if (s.memory_budget >= Need(c, 1 + static_cast<uint64_t>(k.replicas), 1)) return Status::Ok();
    return Error(s.memory_budget_loc, "store.memory_budget",
                 FormatSize(s.memory_budget) + " cannot hold this node's snapshots and " + std::to_string(k.replicas) +
                     " other nodes' copies, each plus one in flight (2 x " + ranks + " ranks x " +
                     std::to_string(1 + k.replicas) + " copies x " + FormatSize(s.snapshot_bytes) +
                     "); raise it or lower cluster.replicas");
  }
  const int d = k.erasure.data, p = k.erasure.parity;
  const uint64_t need = Need(c, static_cast<uint64_t>(d + p), static_cast<uint64_t>(d));
  if (s.memory_budget >= need) return Status::Ok();
  const std::string ratio = std::to_string(p) + "/" + std::to_string(d);
  return Error(s.memory_budget_loc, "store.memory_budget",
               FormatSize(s.memory_budget) + " cannot hold this node's snapshots and its erasure parity " + ratio +
                   " of them, each plus one in flight (2 x " + ranks + " ranks x (1 + erasure parity " + ratio +
                   ") x " + FormatSize(s.snapshot_bytes) + " = " + FormatSize(need) +
                   "); raise it or use less parity in cluster.redundancy");
}

}  // namespace

std::string ErasureGroupError(int nodes, int data, int parity) {
  const int size = data + parity;
  if (size <= 0 || nodes % size == 0) return "";
  const std::string head = "an erasure code of " + std::to_string(data) + " data + " + std::to_string(parity) +
                           " parity needs the nodes in groups of " + std::to_string(size) + "; the job has " +
                           std::to_string(nodes) + " nodes";
  if (nodes < size) return head + " (use " + std::to_string(size) + ", or another code)";
  return head + " (" + std::to_string(nodes % size) + " left over: use " + std::to_string(nodes - nodes % size) +
         " or " + std::to_string(nodes - nodes % size + size) + ", or another code)";
}

std::string FormatLoc(const SourceLoc& loc, const std::string& field) {
  std::string out = loc.file.empty() ? "<default>" : loc.file;
  if (loc.line > 0) out += ":" + std::to_string(loc.line);
  if (!field.empty()) out += ": " + field;
  return out;
}

Config DefaultConfig() {
  Config c;
  c.source = "<default>";
  return c;
}

Status ParseConfig(const std::string& yaml_text, const std::string& source_name, Config* out) {
  Config c;
  c.source = source_name.empty() ? "<input>" : source_name;
  c.store.memory_budget_loc = SourceLoc{c.source, 0, 0};
  c.persist.dir_loc = SourceLoc{c.source, 0, 0};
  c.cluster.redundancy_loc = SourceLoc{c.source, 0, 0};
  Status st;
  try {
    st = ParseDocument(c.source, yaml_text, &c);
  } catch (const std::exception& e) {  // yaml-cpp should not throw past Load; be safe
    st = Status::InvalidArgument(c.source + ": cannot parse config: " + e.what());
  }
  FTRUN_RETURN_IF_ERROR(st);
  FTRUN_RETURN_IF_ERROR(ValidateConfig(c));
  *out = std::move(c);
  return Status::Ok();
}

Status LoadConfigFile(const std::string& path, Config* out) {
  std::string text;
  FTRUN_RETURN_IF_ERROR(ReadWholeFile(path, "config file '" + path + "'", &text));
  return ParseConfig(text, path, out);
}

Status ValidateConfig(const Config& c) {
  // Per-field ranges again: the CLI may have overridden any of them.
  SourceLoc no_line{c.source, 0, 0};
  for (const Key& k : Keys()) {
    if (const char* expected = k.check ? k.check(c) : nullptr) {
      return Error(no_line, std::string(k.section) + "." + k.name,
                   std::string("expected ") + expected + ", got " + k.show(c));
    }
  }
  const StoreConfig& s = c.store;
  uint64_t copies = 2ull * static_cast<uint64_t>(c.agent.ranks_per_node);
  if (s.snapshot_bytes > 0) {
    uint64_t need = s.snapshot_bytes > UINT64_MAX / copies ? UINT64_MAX : copies * s.snapshot_bytes;
    if (s.memory_budget < need) {
      int r = c.agent.ranks_per_node;
      return Error(s.memory_budget_loc, "store.memory_budget",
                   FormatSize(s.memory_budget) + " cannot hold one snapshot of every rank plus one in flight (2 x " +
                       std::to_string(r) + (r == 1 ? " rank x " : " ranks x ") + FormatSize(s.snapshot_bytes) + " = " +
                       FormatSize(need) + "); raise it or lower store.snapshot_bytes");
    }
  }
  if (s.memory_budget < s.chunk_size) {
    return Error(s.memory_budget_loc, "store.memory_budget",
                 FormatSize(s.memory_budget) + " is smaller than one chunk (store.chunk_size = " +
                     FormatSize(s.chunk_size) + "); raise it or lower store.chunk_size");
  }
  const CoordinatorConfig& co = c.coordinator;
  if (co.etcd_cert_file.empty() != co.etcd_key_file.empty()) {
    return Error(no_line, co.etcd_cert_file.empty() ? "coordinator.etcd_cert_file" : "coordinator.etcd_key_file",
                 "expected coordinator.etcd_cert_file and coordinator.etcd_key_file together (a client certificate "
                 "and its key), got only one");
  }
  const PersistConfig& p = c.persist;
  if (!p.dir.empty() && p.every_versions == 0 && p.every_seconds.count() == 0) {
    return Error(p.dir_loc, "persist.dir",
                 "'" + p.dir + "' is set but nothing triggers a write: persist.every_versions is 0 and " +
                     "persist.every_seconds is 0s; set one of them above 0");
  }
  return Status::Ok();
}

Status ValidateClusterConfig(const Config& c, int num_nodes) {
  const ClusterConfig& k = c.cluster;
  if (num_nodes > 1 && k.replicas >= num_nodes) {
    return Error(k.redundancy_loc, "cluster.replicas",
                 "expected fewer copies than nodes: " + std::to_string(k.replicas) + " replicas need at least " +
                     std::to_string(k.replicas + 1) + " nodes, the job has " + std::to_string(num_nodes));
  }
  if (num_nodes > 1 && k.erasure.enabled()) {
    std::string why = ErasureGroupError(num_nodes, k.erasure.data, k.erasure.parity);
    if (!why.empty()) return Error(k.redundancy_loc, "cluster.redundancy", why);
  }
  if (num_nodes > 1) FTRUN_RETURN_IF_ERROR(CheckClusterBudget(c));
  if (num_nodes > 1 && !c.persist.dir.empty() && c.persist.every_versions == 0) {
    return Error(c.persist.dir_loc, "persist.every_versions",
                 "a job of " + std::to_string(num_nodes) +
                     " nodes with persist.dir needs it above 0: every node "
                     "writes the committed versions that are multiples of it, so that they complete on disk together");
  }
  return Status::Ok();
}

std::string ClusterConfigAdvice(const Config& c, int num_nodes) {
  constexpr int kBigJob = 1024;
  constexpr std::chrono::milliseconds kBigJobInterval{500};
  const ClusterConfig& k = c.cluster;
  if (num_nodes < kBigJob || k.heartbeat_interval >= kBigJobInterval) return {};
  const auto timeout = k.heartbeat_interval * k.heartbeat_misses;
  const long misses = std::max<long>(1, static_cast<long>(timeout / kBigJobInterval));
  const long per_second = static_cast<long>(num_nodes * 1000 / k.heartbeat_interval.count());
  char fewer[32];
  std::snprintf(fewer, sizeof(fewer), "%.1f",
                static_cast<double>(kBigJobInterval.count()) / static_cast<double>(k.heartbeat_interval.count()));
  return "cluster.heartbeat_interval " + std::to_string(k.heartbeat_interval.count()) + "ms at " +
         std::to_string(num_nodes) + " nodes: up to " + std::to_string(per_second) +
         " heartbeats a second each way at the coordinator, most of its messages; cluster.heartbeat_interval: "
         "500ms with cluster.heartbeat_misses: " +
         std::to_string(misses) + " notices a lost node after " + std::to_string((kBigJobInterval * misses).count()) +
         " ms (now " + std::to_string(timeout.count()) + " ms) with " + fewer +
         "x fewer heartbeats (docs/benchmarks.md, scale)";
}

}  // namespace ftrun
