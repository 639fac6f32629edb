#include "plugin/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
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

Status ParseSection(const std::string& file, const std::string& section, const YAML::Node& map, Config* c) {
  std::set<std::string> seen;
  for (const auto& kv : map) {
    SourceLoc loc = LocOf(file, kv.first.Mark());
    if (!kv.first.IsScalar()) return Error(loc, section, "expected plain key names, got " + Describe(kv.first));
    std::string field = section + "." + kv.first.Scalar();
    const Key* key = FindKey(section, kv.first.Scalar());
    if (key == nullptr) return Error(loc, field, "unknown key (known: " + KnownKeys(section) + ")");
    if (!seen.insert(key->name).second) return Error(loc, field, "duplicate key");
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

}  // namespace

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
  SourceLoc no_line{c.source, 0, 0};
  if (c.cluster.replicas >= num_nodes && num_nodes > 1) {
    return Error(no_line, "cluster.replicas",
                 "expected fewer copies than nodes: " + std::to_string(c.cluster.replicas) +
                     " replicas need at least " + std::to_string(c.cluster.replicas + 1) + " nodes, the job has " +
                     std::to_string(num_nodes));
  }
  const StoreConfig& s = c.store;
  uint64_t copies =
      2ull * static_cast<uint64_t>(c.agent.ranks_per_node) * (1 + static_cast<uint64_t>(c.cluster.replicas));
  if (num_nodes > 1 && s.snapshot_bytes > 0 && s.memory_budget / copies < s.snapshot_bytes) {
    return Error(s.memory_budget_loc, "store.memory_budget",
                 FormatSize(s.memory_budget) + " cannot hold this node's snapshots and " +
                     std::to_string(c.cluster.replicas) + " other nodes' copies, each plus one in flight (2 x " +
                     std::to_string(c.agent.ranks_per_node) + " ranks x " + std::to_string(1 + c.cluster.replicas) +
                     " copies x " + FormatSize(s.snapshot_bytes) + "); raise it or lower cluster.replicas");
  }
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
