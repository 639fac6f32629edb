#include "plugin/config/config.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <set>
#include <string>
#include <vector>

#include "plugin/common/file.h"
#include "plugin/config/units.h"
#include "plugin/store/manifest.h"

namespace ftrun {
namespace {

constexpr uint64_t kMinChunk = 64ull << 10;
constexpr uint64_t kMaxChunk = kMaxChunkSize;
constexpr size_t kMaxJobIdLength = 64;
constexpr uint64_t kMinRateLimit = 1ull << 20;

std::string Quote(const std::string& s) { return "'" + s + "'"; }

Status ParseInt(const std::string& text, const char* what, int* out) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  bool digits_only = !text.empty() && end == text.c_str() + text.size() &&
                     text.find_first_of(" \t") == std::string::npos;
  if (!digits_only || errno == ERANGE || v < INT_MIN || v > INT_MAX) {
    return Status::InvalidArgument(std::string("expected ") + what + ", got " + Quote(text));
  }
  *out = static_cast<int>(v);
  return Status::Ok();
}

Status ParseBool(const std::string& text, bool* out) {
  static const char* const kTrue[] = {"true", "True", "TRUE", "yes", "Yes",
                                      "YES",  "on",   "On",   "ON"};
  static const char* const kFalse[] = {"false", "False", "FALSE", "no", "No",
                                       "NO",    "off",   "Off",   "OFF"};
  for (const char* t : kTrue) {
    if (text == t) return *out = true, Status::Ok();
  }
  for (const char* f : kFalse) {
    if (text == f) return *out = false, Status::Ok();
  }
  return Status::InvalidArgument("expected true or false, got " + Quote(text));
}

bool ValidJobId(const std::string& id) {
  if (id.size() > kMaxJobIdLength || (!id.empty() && id[0] == '.')) return false;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string Bytes(uint64_t b) { return std::to_string(b) + " bytes"; }
std::string Millis(std::chrono::milliseconds d) { return std::to_string(d.count()) + "ms"; }

// One known key. `set` parses the scalar into the field (its error says what
// was expected); `check` (optional) returns nullptr when the field's value is
// in range, else what was expected; `show` prints the value for
// ValidateConfig, which has no text to quote.
struct Key {
  const char* section;
  const char* name;
  const char* what;  // for "expected <what>, got a map"
  Status (*set)(const std::string& text, Config* c);
  const char* (*check)(const Config& c);
  std::string (*show)(const Config& c);
};

const Key kKeys[] = {
    {"job", "id", "a job id of letters, digits, '.', '_' and '-'",
     [](const std::string& t, Config* c) { return c->job.id = t, Status::Ok(); },
     [](const Config& c) -> const char* {
       return ValidJobId(c.job.id)
                  ? nullptr
                  : "at most 64 letters, digits, '.', '_' or '-', not starting with '.'";
     },
     [](const Config& c) { return Quote(c.job.id); }},
    {"job", "max_restarts", "an integer >= 0",
     [](const std::string& t, Config* c) {
       return ParseInt(t, "an integer >= 0", &c->job.max_restarts);
     },
     [](const Config& c) -> const char* {
       return c.job.max_restarts >= 0 ? nullptr : "an integer >= 0";
     },
     [](const Config& c) { return std::to_string(c.job.max_restarts); }},
    {"job", "hang_timeout", "a duration like 60s",
     [](const std::string& t, Config* c) { return ParseDuration(t, &c->job.hang_timeout); },
     [](const Config& c) -> const char* {
       return c.job.hang_timeout.count() > 0 ? nullptr : "a duration > 0 like 60s";
     },
     [](const Config& c) { return Millis(c.job.hang_timeout); }},
    {"job", "stop_grace", "a duration like 5s",
     [](const std::string& t, Config* c) { return ParseDuration(t, &c->job.stop_grace); },
     [](const Config& c) -> const char* {
       return c.job.stop_grace.count() >= 0 ? nullptr : "a duration >= 0 like 5s";
     },
     [](const Config& c) { return Millis(c.job.stop_grace); }},
    {"store", "memory_budget", "a size like 4GiB or 512MiB",
     [](const std::string& t, Config* c) { return ParseSize(t, &c->store.memory_budget); },
     nullptr,  // checked against the other store fields in ValidateConfig
     [](const Config& c) { return Bytes(c.store.memory_budget); }},
    {"store", "chunk_size", "a size like 4MiB",
     [](const std::string& t, Config* c) { return ParseSize(t, &c->store.chunk_size); },
     [](const Config& c) -> const char* {
       uint64_t v = c.store.chunk_size;
       bool pow2 = v != 0 && (v & (v - 1)) == 0;
       return pow2 && v >= kMinChunk && v <= kMaxChunk
                  ? nullptr
                  : "a power of two from 64KiB to 1GiB, like 4MiB";
     },
     [](const Config& c) { return Bytes(c.store.chunk_size); }},
    {"store", "snapshot_bytes", "a size like 2GiB, or 0 for unknown",
     [](const std::string& t, Config* c) { return ParseSize(t, &c->store.snapshot_bytes); },
     nullptr, [](const Config& c) { return Bytes(c.store.snapshot_bytes); }},
    {"store", "prefault", "true or false",
     [](const std::string& t, Config* c) { return ParseBool(t, &c->store.prefault); }, nullptr,
     [](const Config& c) { return std::string(c.store.prefault ? "true" : "false"); }},
    {"cluster", "replicas", "an integer >= 0",
     [](const std::string& t, Config* c) { return ParseInt(t, "an integer >= 0", &c->cluster.replicas); },
     [](const Config& c) -> const char* { return c.cluster.replicas >= 0 ? nullptr : "an integer >= 0"; },
     [](const Config& c) { return std::to_string(c.cluster.replicas); }},
    {"cluster", "spares", "an integer >= 0",
     [](const std::string& t, Config* c) { return ParseInt(t, "an integer >= 0", &c->cluster.spares); },
     [](const Config& c) -> const char* { return c.cluster.spares >= 0 ? nullptr : "an integer >= 0"; },
     [](const Config& c) { return std::to_string(c.cluster.spares); }},
    {"cluster", "heartbeat_interval", "a duration like 200ms",
     [](const std::string& t, Config* c) { return ParseDuration(t, &c->cluster.heartbeat_interval); },
     [](const Config& c) -> const char* {
       return c.cluster.heartbeat_interval.count() > 0 ? nullptr : "a duration > 0 like 200ms";
     },
     [](const Config& c) { return Millis(c.cluster.heartbeat_interval); }},
    {"cluster", "heartbeat_misses", "an integer >= 1",
     [](const std::string& t, Config* c) { return ParseInt(t, "an integer >= 1", &c->cluster.heartbeat_misses); },
     [](const Config& c) -> const char* { return c.cluster.heartbeat_misses >= 1 ? nullptr : "an integer >= 1"; },
     [](const Config& c) { return std::to_string(c.cluster.heartbeat_misses); }},
    {"cluster", "lost_node_timeout", "a duration like 60s",
     [](const std::string& t, Config* c) { return ParseDuration(t, &c->cluster.lost_node_timeout); },
     [](const Config& c) -> const char* {
       return c.cluster.lost_node_timeout.count() > 0 ? nullptr : "a duration > 0 like 60s";
     },
     [](const Config& c) { return Millis(c.cluster.lost_node_timeout); }},
    {"cluster", "copy_timeout", "a duration like 5s",
     [](const std::string& t, Config* c) { return ParseDuration(t, &c->cluster.copy_timeout); },
     [](const Config& c) -> const char* {
       return c.cluster.copy_timeout.count() > 0 ? nullptr : "a duration > 0 like 5s";
     },
     [](const Config& c) { return Millis(c.cluster.copy_timeout); }},
    {"persist", "dir", "a directory path, or \"\" for no disk copies",
     [](const std::string& t, Config* c) { return c->persist.dir = t, Status::Ok(); }, nullptr,
     [](const Config& c) { return Quote(c.persist.dir); }},
    {"persist", "every_versions", "an integer >= 0",
     [](const std::string& t, Config* c) { return ParseInt(t, "an integer >= 0", &c->persist.every_versions); },
     [](const Config& c) -> const char* { return c.persist.every_versions >= 0 ? nullptr : "an integer >= 0"; },
     [](const Config& c) { return std::to_string(c.persist.every_versions); }},
    {"persist", "every_seconds", "a duration like 300s",
     [](const std::string& t, Config* c) { return ParseDuration(t, &c->persist.every_seconds); },
     [](const Config& c) -> const char* {
       return c.persist.every_seconds.count() >= 0 ? nullptr : "a duration >= 0 like 300s";
     },
     [](const Config& c) { return Millis(c.persist.every_seconds); }},
    {"persist", "keep", "an integer >= 1",
     [](const std::string& t, Config* c) { return ParseInt(t, "an integer >= 1", &c->persist.keep); },
     [](const Config& c) -> const char* { return c.persist.keep >= 1 ? nullptr : "an integer >= 1"; },
     [](const Config& c) { return std::to_string(c.persist.keep); }},
    {"persist", "rate_limit", "a size per second like 500MiB, or 0 for unlimited",
     [](const std::string& t, Config* c) { return ParseSize(t, &c->persist.rate_limit); },
     [](const Config& c) -> const char* {
       uint64_t v = c.persist.rate_limit;
       return v == 0 || v >= kMinRateLimit ? nullptr : "0 (unlimited) or at least 1MiB per second, like 500MiB";
     },
     [](const Config& c) { return Bytes(c.persist.rate_limit); }},
    {"persist", "direct_io", "true or false",
     [](const std::string& t, Config* c) { return ParseBool(t, &c->persist.direct_io); }, nullptr,
     [](const Config& c) { return std::string(c.persist.direct_io ? "true" : "false"); }},
    {"persist", "file_mode", "an octal mode: 0600, 0640 or 0660",
     [](const std::string& t, Config* c) {
       bool octal = t.size() >= 3 && t.size() <= 4 && t.find_first_not_of("01234567") == std::string::npos;
       if (!octal) return Status::InvalidArgument("expected an octal mode like 0600, got " + Quote(t));
       c->persist.file_mode = static_cast<uint32_t>(std::strtoul(t.c_str(), nullptr, 8));
       return Status::Ok();
     },
     [](const Config& c) -> const char* {
       uint32_t m = c.persist.file_mode;  // the owner reads and writes; others never; the group at most rw
       return (m & 0600) == 0600 && (m & ~0660u) == 0
                  ? nullptr
                  : "0600 (the job's user only), 0640 or 0660 (its group may read, or read and write)";
     },
     [](const Config& c) {
       char buf[8];
       std::snprintf(buf, sizeof buf, "%04o", c.persist.file_mode);
       return std::string(buf);
     }},
    {"persist", "drain_timeout", "a duration like 60s",
     [](const std::string& t, Config* c) { return ParseDuration(t, &c->persist.drain_timeout); },
     [](const Config& c) -> const char* {
       return c.persist.drain_timeout.count() >= 0 ? nullptr : "a duration >= 0 like 60s";
     },
     [](const Config& c) { return Millis(c.persist.drain_timeout); }},
    {"agent", "run_dir", "a directory path",
     [](const std::string& t, Config* c) { return c->agent.run_dir = t, Status::Ok(); },
     [](const Config& c) -> const char* {
       return c.agent.run_dir.empty() ? "a directory path" : nullptr;
     },
     [](const Config& c) { return Quote(c.agent.run_dir); }},
    {"agent", "log_level", "one of trace, debug, info, warn, error",
     [](const std::string& t, Config* c) { return c->agent.log_level = t, Status::Ok(); },
     [](const Config& c) -> const char* {
       static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error"};
       return kLevels.count(c.agent.log_level) ? nullptr : "one of trace, debug, info, warn, error";
     },
     [](const Config& c) { return Quote(c.agent.log_level); }},
    {"agent", "ranks_per_node", "an integer >= 1",
     [](const std::string& t, Config* c) {
       return ParseInt(t, "an integer >= 1", &c->agent.ranks_per_node);
     },
     [](const Config& c) -> const char* {
       return c.agent.ranks_per_node >= 1 ? nullptr : "an integer >= 1";
     },
     [](const Config& c) { return std::to_string(c.agent.ranks_per_node); }},
};

const char* const kSections[] = {"job", "store", "agent", "cluster", "persist"};

std::string SectionList() {
  std::string out;
  for (const char* s : kSections) out += (out.empty() ? "" : ", ") + std::string(s);
  return out;
}

std::string KnownKeys(const std::string& section) {
  std::string out;
  for (const Key& k : kKeys) {
    if (section != k.section) continue;
    out += (out.empty() ? "" : ", ") + std::string(k.name);
  }
  return out;
}

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

Status ParseSection(const std::string& file, const std::string& section, const YAML::Node& map,
                    Config* c) {
  std::set<std::string> seen;
  for (const auto& kv : map) {
    SourceLoc loc = LocOf(file, kv.first.Mark());
    if (!kv.first.IsScalar())
      return Error(loc, section, "expected plain key names, got " + Describe(kv.first));
    std::string field = section + "." + kv.first.Scalar();
    const Key* key = nullptr;
    for (const Key& k : kKeys) {
      if (section == k.section && kv.first.Scalar() == k.name) key = &k;
    }
    if (key == nullptr) return Error(loc, field, "unknown key (known: " + KnownKeys(section) + ")");
    if (!seen.insert(key->name).second) return Error(loc, field, "duplicate key");
    if (!kv.second.IsScalar()) {
      return Error(loc, field,
                   std::string("expected ") + key->what + ", got " + Describe(kv.second));
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
    std::string where =
        loc.line > 0 ? file + ":" + std::to_string(loc.line) + ":" + std::to_string(loc.column)
                     : file;
    return Status::InvalidArgument(where + ": YAML syntax error: " + e.msg);
  }
  if (docs.empty()) return Status::Ok();  // empty file: all defaults
  if (docs.size() > 1) {
    return Error(LocOf(file, docs[1].Mark()), "",
                 "expected one YAML document, found " + std::to_string(docs.size()));
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
    if (!kv.first.IsScalar())
      return Error(loc, "", "expected section names, got " + Describe(kv.first));
    const std::string& name = kv.first.Scalar();
    bool known = false;
    for (const char* s : kSections) known = known || name == s;
    if (!known) return Error(loc, name, "unknown key (known: " + SectionList() + ")");
    if (!seen.insert(name).second) return Error(loc, name, "duplicate key");
    if (kv.second.IsNull()) continue;  // "job:" with nothing under it
    if (!kv.second.IsMap()) {
      return Error(loc, name,
                   "expected a map of " + name + " settings (" + KnownKeys(name) + "), got " +
                       Describe(kv.second));
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
  for (const Key& k : kKeys) {
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
                   FormatSize(s.memory_budget) +
                       " cannot hold one snapshot of every rank plus one in flight (2 x " +
                       std::to_string(r) + (r == 1 ? " rank x " : " ranks x ") +
                       FormatSize(s.snapshot_bytes) + " = " + FormatSize(need) +
                       "); raise it or lower store.snapshot_bytes");
    }
  }
  if (s.memory_budget < s.chunk_size) {
    return Error(s.memory_budget_loc, "store.memory_budget",
                 FormatSize(s.memory_budget) + " is smaller than one chunk (store.chunk_size = " +
                     FormatSize(s.chunk_size) + "); raise it or lower store.chunk_size");
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
                 "expected fewer copies than nodes: " + std::to_string(c.cluster.replicas) + " replicas need at least " +
                     std::to_string(c.cluster.replicas + 1) + " nodes, the job has " + std::to_string(num_nodes));
  }
  const StoreConfig& s = c.store;
  uint64_t copies = 2ull * static_cast<uint64_t>(c.agent.ranks_per_node) * (1 + static_cast<uint64_t>(c.cluster.replicas));
  if (num_nodes > 1 && s.snapshot_bytes > 0 && s.memory_budget / copies < s.snapshot_bytes) {
    return Error(s.memory_budget_loc, "store.memory_budget",
                 FormatSize(s.memory_budget) + " cannot hold this node's snapshots and " +
                     std::to_string(c.cluster.replicas) + " other nodes' copies, each plus one in flight (2 x " +
                     std::to_string(c.agent.ranks_per_node) + " ranks x " + std::to_string(1 + c.cluster.replicas) +
                     " copies x " + FormatSize(s.snapshot_bytes) + "); raise it or lower cluster.replicas");
  }
  if (num_nodes > 1 && !c.persist.dir.empty() && c.persist.every_versions == 0) {
    return Error(c.persist.dir_loc, "persist.every_versions",
                 "a job of " + std::to_string(num_nodes) + " nodes with persist.dir needs it above 0: every node "
                 "writes the committed versions that are multiples of it, so that they complete on disk together");
  }
  return Status::Ok();
}

}  // namespace ftrun
