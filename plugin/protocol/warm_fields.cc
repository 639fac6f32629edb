#include "plugin/protocol/warm_fields.h"

#include <cerrno>
#include <cstdlib>

namespace ftrun {

namespace {

bool ValidKey(const std::string& k) {
  if (k.empty() || k.size() > 128) return false;
  for (char c : k) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::string EncodeWarmFields(const WarmFields& fields) {
  std::string out;
  for (const auto& [k, v] : fields) {
    if (!ValidKey(k) || v.find('\n') != std::string::npos) continue;  // never sent: see Decode
    out += k + "=" + v + "\n";
  }
  return out;
}

Status DecodeWarmFields(const std::string& payload, WarmFields* out) {
  out->clear();
  size_t pos = 0;
  while (pos < payload.size()) {
    size_t nl = payload.find('\n', pos);
    if (nl == std::string::npos) return Status::InvalidArgument("warm frame: last line has no newline");
    std::string line = payload.substr(pos, nl - pos);
    pos = nl + 1;
    size_t eq = line.find('=');
    if (eq == std::string::npos) return Status::InvalidArgument("warm frame: a line without '=': expected key=value");
    std::string key = line.substr(0, eq);
    if (!ValidKey(key)) return Status::InvalidArgument("warm frame: bad key '" + key.substr(0, 64) + "'");
    if (out->size() >= kMaxWarmFields) return Status::InvalidArgument("warm frame: more than 256 fields");
    if (!out->emplace(key, line.substr(eq + 1)).second)
      return Status::InvalidArgument("warm frame: field '" + key + "' given twice");
  }
  return Status::Ok();
}

Status WarmInt(const WarmFields& fields, const std::string& key, long long lo, long long hi, long long* out) {
  auto it = fields.find(key);
  if (it == fields.end()) return Status::InvalidArgument("warm frame: field '" + key + "' missing");
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
    return Status::InvalidArgument("warm frame: field '" + key + "' must be an integer in [" + std::to_string(lo) +
                                   ", " + std::to_string(hi) + "], got '" + it->second.substr(0, 64) + "'");
  }
  *out = v;
  return Status::Ok();
}

}  // namespace ftrun
