// The table of every config key: its section, how its text parses into
// Config, its range, and how ValidateConfig shows it (config_keys.h).
#include "plugin/config/config_keys.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <iterator>
#include <set>

#include "plugin/config/units.h"
#include "plugin/store/manifest.h"

namespace ftrun {
namespace config_keys {

std::string Quote(const std::string& s) { return "'" + s + "'"; }

Status ParseInt(const std::string& text, const char* what, int* out) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  bool digits_only =
      !text.empty() && end == text.c_str() + text.size() && text.find_first_of(" \t") == std::string::npos;
  if (!digits_only || errno == ERANGE || v < INT_MIN || v > INT_MAX) {
    return Status::InvalidArgument(std::string("expected ") + what + ", got " + Quote(text));
  }
  *out = static_cast<int>(v);
  return Status::Ok();
}

namespace {

constexpr uint64_t kMinChunk = 64ull << 10;
constexpr uint64_t kMaxChunk = kMaxChunkSize;
constexpr size_t kMaxJobIdLength = 64;
constexpr uint64_t kMinRateLimit = 1ull << 20;

Status ParseBool(const std::string& text, bool* out) {
  static const char* const kTrue[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const char* const kFalse[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  for (const char* t : kTrue) {
    if (text == t) return *out = true, Status::Ok();
  }
  for (const char* f : kFalse) {
    if (text == f) return *out = false, Status::Ok();
  }
  return Status::InvalidArgument("expected true or false, got " + Quote(text));
}

// "HOST:PORT" (PORT 0 to 65535, HOST not empty) or "": nullptr; else what
// was expected.
const char* ListenOrEmpty(const std::string& s) {
  static const char* const kWant = "HOST:PORT (port 0 to 65535; 0: any free port) or empty (off)";
  if (s.empty()) return nullptr;
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size() || colon + 6 < s.size()) return kWant;
  long port = 0;
  for (size_t i = colon + 1; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return kWant;
    port = port * 10 + (s[i] - '0');
  }
  return port <= 65535 && s.find_first_of(" \t/") == std::string::npos ? nullptr : kWant;
}

bool ValidJobId(const std::string& id) {
  if (id.size() > kMaxJobIdLength || (!id.empty() && id[0] == '.')) return false;
  for (char c : id) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// "http://host:port,https://..." -> the URLs; each must be http:// or
// https:// with a host, and no path.
Status ParseEndpoints(const std::string& text, std::vector<std::string>* out) {
  out->clear();
  size_t at = 0;
  while (at <= text.size() && !text.empty()) {
    size_t comma = text.find(',', at);
    std::string e = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    while (!e.empty() && e.front() == ' ') e.erase(e.begin());
    while (!e.empty() && e.back() == ' ') e.pop_back();
    const size_t scheme = e.rfind("http://", 0) == 0 ? 7 : e.rfind("https://", 0) == 0 ? 8 : 0;
    if (scheme == 0 || e.size() == scheme || e.find('/', scheme) != std::string::npos ||
        e.find_first_of(" \t") != std::string::npos) {
      return Status::InvalidArgument("expected http://HOST:PORT or https://HOST:PORT URLs separated by commas, got " +
                                     Quote(e));
    }
    out->push_back(e);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return Status::Ok();
}

std::string JoinEndpoints(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& e : v) out += (out.empty() ? "" : ",") + e;
  return out;
}

static_assert(ErasureConfig::kMaxData == 32 && ErasureConfig::kMaxParity == 8, "the bounds in these messages");

// cluster.redundancy as ValidateConfig checks it after the command line: an
// erasure code within ReedSolomon's bounds that replaces the copies, or none
// (then cluster.replicas' own check applies).
const char* RedundancyExpected(const ClusterConfig& k) {
  const ErasureConfig& e = k.erasure;
  if (e.data == 0 && e.parity == 0) return nullptr;
  if (e.data < 1 || e.data > ErasureConfig::kMaxData || e.parity < 1 || e.parity > ErasureConfig::kMaxParity) {
    return "erasure data from 1 to 32 and parity from 1 to 8";
  }
  return k.replicas == 0 ? nullptr : "erasure with cluster.replicas 0 (the code replaces the copies)";
}

std::string ShowRedundancy(const ClusterConfig& k) {
  const ErasureConfig& e = k.erasure;
  if (e.data == 0 && e.parity == 0) return "{replicas: " + std::to_string(k.replicas) + "}";
  std::string out = "{erasure: {data: " + std::to_string(e.data) + ", parity: " + std::to_string(e.parity) + "}";
  return k.replicas == 0 ? out + "}" : out + ", replicas: " + std::to_string(k.replicas) + "}";
}

std::string Bytes(uint64_t b) { return std::to_string(b) + " bytes"; }
std::string Millis(std::chrono::milliseconds d) { return std::to_string(d.count()) + "ms"; }

const Key kTable[] = {
    {"job", "id", "a job id of letters, digits, '.', '_' and '-'",
     [](const std::string& t, Config* c) { return c->job.id = t, Status::Ok(); },
     [](const Config& c) -> const char* {
       return ValidJobId(c.job.id) ? nullptr : "at most 64 letters, digits, '.', '_' or '-', not starting with '.'";
     },
     [](const Config& c) { return Quote(c.job.id); }},
    {"job", "max_restarts", "an integer >= 0",
     [](const std::string& t, Config* c) { return ParseInt(t, "an integer >= 0", &c->job.max_restarts); },
     [](const Config& c) -> const char* { return c.job.max_restarts >= 0 ? nullptr : "an integer >= 0"; },
     [](const Config& c) { return std::to_string(c.job.max_restarts); }},
    {"job", "hang_timeout", "a duration like 60s",
     [](const std::string& t, Config* c) { return ParseDuration(t, &c->job.hang_timeout); },
     [](const Config& c) -> const char* {
       return c.job.hang_timeout.count() > 0 ? nullptr : "a duration > 0 like 60s";
     },
     [](const Config& c) { return Millis(c.job.hang_timeout); }},
    {"job", "stop_grace", "a duration like 5s",
     [](const std::string& t, Config* c) { return ParseDuration(t, &c->job.stop_grace); },
     [](const Config& c) -> const char* { return c.job.stop_grace.count() >= 0 ? nullptr : "a duration >= 0 like 5s"; },
     [](const Config& c) { return Millis(c.job.stop_grace); }},
    {"job", "output_prefix", "true or false",
     [](const std::string& t, Config* c) { return ParseBool(t, &c->job.output_prefix); }, nullptr,
     [](const Config& c) { return std::string(c.job.output_prefix ? "true" : "false"); }},
    {"store", "memory_budget", "a size like 4GiB or 512MiB",
     [](const std::string& t, Config* c) { return ParseSize(t, &c->store.memory_budget); },
     nullptr,  // checked against the other store fields in ValidateConfig
     [](const Config& c) { return Bytes(c.store.memory_budget); }},
    {"store", "chunk_size", "a size like 4MiB",
     [](const std::string& t, Config* c) { return ParseSize(t, &c->store.chunk_size); },
     [](const Config& c) -> const char* {
       uint64_t v = c.store.chunk_size;
       bool pow2 = v != 0 && (v & (v - 1)) == 0;
       return pow2 && v >= kMinChunk && v <= kMaxChunk ? nullptr : "a power of two from 64KiB to 1GiB, like 4MiB";
     },
     [](const Config& c) { return Bytes(c.store.chunk_size); }},
    {"store", "snapshot_bytes", "a size like 2GiB, or 0 for unknown",
     [](const std::string& t, Config* c) { return ParseSize(t, &c->store.snapshot_bytes); }, nullptr,
     [](const Config& c) { return Bytes(c.store.snapshot_bytes); }},
    {"store", "prefault", "true or false",
     [](const std::string& t, Config* c) { return ParseBool(t, &c->store.prefault); }, nullptr,
     [](const Config& c) { return std::string(c.store.prefault ? "true" : "false"); }},
    {"restart", "warm_standbys", "auto or an integer >= 0",
     [](const std::string& t, Config* c) {
       if (t == "auto") return c->restart.warm_standbys = RestartConfig::kAuto, Status::Ok();
       int n = 0;
       FTRUN_RETURN_IF_ERROR(ParseInt(t, "auto or an integer >= 0", &n));
       if (n < 0) return Status::InvalidArgument("expected auto or an integer >= 0, got " + Quote(t));
       return c->restart.warm_standbys = n, Status::Ok();
     },
     [](const Config& c) -> const char* {
       return c.restart.warm_standbys >= RestartConfig::kAuto ? nullptr : "auto or an integer >= 0";
     },
     [](const Config& c) {
       return c.restart.warm_standbys == RestartConfig::kAuto ? std::string("auto")
                                                              : std::to_string(c.restart.warm_standbys);
     }},
    {"restart", "abort_timeout", "a duration like 5s",
     [](const std::string& t, Config* c) { return ParseDuration(t, &c->restart.abort_timeout); },
     [](const Config& c) -> const char* {
       return c.restart.abort_timeout.count() > 0 ? nullptr : "a duration > 0 like 5s";
     },
     [](const Config& c) { return Millis(c.restart.abort_timeout); }},
    {"cluster", "replicas", "an integer >= 0",
     [](const std::string& t, Config* c) { return ParseInt(t, "an integer >= 0", &c->cluster.replicas); },
     [](const Config& c) -> const char* { return c.cluster.replicas >= 0 ? nullptr : "an integer >= 0"; },
     [](const Config& c) { return std::to_string(c.cluster.replicas); }},
    {"cluster", "redundancy", "a map: {erasure: {data: D, parity: P}} or {replicas: K}", nullptr,
     [](const Config& c) { return RedundancyExpected(c.cluster); },
     [](const Config& c) { return ShowRedundancy(c.cluster); }},
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
     [](const Config& c) -> const char* { return c.agent.run_dir.empty() ? "a directory path" : nullptr; },
     [](const Config& c) { return Quote(c.agent.run_dir); }},
    {"agent", "log_level", "one of trace, debug, info, warn, error",
     [](const std::string& t, Config* c) { return c->agent.log_level = t, Status::Ok(); },
     [](const Config& c) -> const char* {
       static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error"};
       return kLevels.count(c.agent.log_level) ? nullptr : "one of trace, debug, info, warn, error";
     },
     [](const Config& c) { return Quote(c.agent.log_level); }},
    {"agent", "ranks_per_node", "an integer >= 1",
     [](const std::string& t, Config* c) { return ParseInt(t, "an integer >= 1", &c->agent.ranks_per_node); },
     [](const Config& c) -> const char* { return c.agent.ranks_per_node >= 1 ? nullptr : "an integer >= 1"; },
     [](const Config& c) { return std::to_string(c.agent.ranks_per_node); }},
    {"metrics", "agent_listen", "HOST:PORT or empty (off)",
     [](const std::string& t, Config* c) { return c->metrics.agent_listen = t, Status::Ok(); },
     [](const Config& c) -> const char* { return ListenOrEmpty(c.metrics.agent_listen); },
     [](const Config& c) { return Quote(c.metrics.agent_listen); }},
    {"metrics", "coordinator_listen", "HOST:PORT or empty (off)",
     [](const std::string& t, Config* c) { return c->metrics.coordinator_listen = t, Status::Ok(); },
     [](const Config& c) -> const char* { return ListenOrEmpty(c.metrics.coordinator_listen); },
     [](const Config& c) { return Quote(c.metrics.coordinator_listen); }},
    {"coordinator", "etcd_endpoints", "comma-separated http:// or https:// URLs, or empty (no etcd)",
     [](const std::string& t, Config* c) { return ParseEndpoints(t, &c->coordinator.etcd_endpoints); }, nullptr,
     [](const Config& c) { return Quote(JoinEndpoints(c.coordinator.etcd_endpoints)); }},
    {"coordinator", "etcd_prefix", "a key prefix starting with '/'",
     [](const std::string& t, Config* c) { return c->coordinator.etcd_prefix = t, Status::Ok(); },
     [](const Config& c) -> const char* {
       const std::string& p = c.coordinator.etcd_prefix;
       return p.size() >= 2 && p[0] == '/' && p.back() != '/' && p.size() <= 256 ? nullptr : "a key prefix like /ftrun";
     },
     [](const Config& c) { return Quote(c.coordinator.etcd_prefix); }},
    {"coordinator", "etcd_lease_ttl", "a duration like 5s",
     [](const std::string& t, Config* c) { return ParseDuration(t, &c->coordinator.etcd_lease_ttl); },
     [](const Config& c) -> const char* {
       const auto ms = c.coordinator.etcd_lease_ttl.count();
       return ms >= 2000 && ms <= 300000 && ms % 1000 == 0 ? nullptr : "whole seconds from 2s to 300s";
     },
     [](const Config& c) { return Millis(c.coordinator.etcd_lease_ttl); }},
    {"coordinator", "etcd_ca_file", "a file path",
     [](const std::string& t, Config* c) { return c->coordinator.etcd_ca_file = t, Status::Ok(); }, nullptr,
     [](const Config& c) { return Quote(c.coordinator.etcd_ca_file); }},
    {"coordinator", "etcd_cert_file", "a file path",
     [](const std::string& t, Config* c) { return c->coordinator.etcd_cert_file = t, Status::Ok(); }, nullptr,
     [](const Config& c) { return Quote(c.coordinator.etcd_cert_file); }},
    {"coordinator", "etcd_key_file", "a file path",
     [](const std::string& t, Config* c) { return c->coordinator.etcd_key_file = t, Status::Ok(); }, nullptr,
     [](const Config& c) { return Quote(c.coordinator.etcd_key_file); }},
};

const char* const kSectionNames[] = {"job",     "store",   "agent",   "cluster",
                                     "persist", "restart", "metrics", "coordinator"};

}  // namespace

const Key* Keys::begin() { return std::begin(kTable); }
const Key* Keys::end() { return std::end(kTable); }

bool IsSection(const std::string& name) {
  for (const char* s : kSectionNames) {
    if (name == s) return true;
  }
  return false;
}

std::string SectionList() {
  std::string out;
  for (const char* s : kSectionNames) out += (out.empty() ? "" : ", ") + std::string(s);
  return out;
}

const Key* FindKey(const std::string& section, const std::string& name) {
  for (const Key& k : Keys()) {
    if (section == k.section && name == k.name) return &k;
  }
  return nullptr;
}

std::string KnownKeys(const std::string& section) {
  std::string out;
  for (const Key& k : Keys()) {
    if (section != k.section) continue;
    out += (out.empty() ? "" : ", ") + std::string(k.name);
  }
  return out;
}

}  // namespace config_keys
}  // namespace ftrun
