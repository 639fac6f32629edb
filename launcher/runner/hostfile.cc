#include "launcher/runner/hostfile.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "plugin/common/file.h"
#include "plugin/config/config_keys.h"

namespace ftrun {
namespace {

constexpr char kLineFormat[] = "'HOST slots=N [rack=NAME]'";
constexpr char kSpecFormat[] = "NODE_SPEC[@NODE_SPEC...] with NODE_SPEC=NAME[:SLOT[,SLOT...]]";
constexpr size_t kMaxListedHosts = 16;

using config_keys::Quote;

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && IsSpace(s[b])) ++b;
  while (e > b && IsSpace(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> SplitWords(const std::string& s) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && IsSpace(s[i])) ++i;
    size_t start = i;
    while (i < s.size() && !IsSpace(s[i])) ++i;
    if (i > start) words.push_back(s.substr(start, i - start));
  }
  return words;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    size_t pos = s.find(sep, start);
    if (pos == std::string::npos) {
      parts.push_back(s.substr(start));
      return parts;
    }
    parts.push_back(s.substr(start, pos - start));
    start = pos + 1;
  }
}

// Parses a non-empty run of decimal digits into [0, limit]; false on junk
// or overflow past `limit`.
bool ParseBoundedInt(const std::string& text, long long limit, long long* out) {
  if (text.empty()) return false;
  long long v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
    if (v > limit) v = limit + 1;  // saturate: keeps "too big" distinguishable
  }
  *out = v;
  return true;
}

Status LineError(const std::string& source, int line, const std::string& what) {
  return Status::InvalidArgument(source + ":" + std::to_string(line) + ": " + what);
}

std::string KnownHosts(const std::vector<HostEntry>& hosts) {
  std::string s;
  for (size_t i = 0; i < hosts.size() && i < kMaxListedHosts; ++i) {
    if (i > 0) s += ", ";
    s += hosts[i].host;
  }
  if (hosts.size() > kMaxListedHosts) s += ", ... (" + std::to_string(hosts.size() - kMaxListedHosts) + " more)";
  return s;
}

// One NODE_SPEC of --include/--exclude: a host index and, optionally, slots.
struct NodeSpec {
  size_t host = 0;
  bool all_slots = true;
  std::vector<int> slots;
};

Status ParseNodeSpecs(const char* flag, const std::string& text, const std::vector<HostEntry>& hosts,
                      std::vector<NodeSpec>* out) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < hosts.size(); ++i) index.emplace(hosts[i].host, i);
  const std::string prefix = std::string(flag) + " " + Quote(text) + ": ";
  out->clear();
  for (const std::string& piece : Split(text, '@')) {
    if (piece.empty()) {
      return Status::InvalidArgument(prefix + "empty NODE_SPEC; expected " + kSpecFormat);
    }
    NodeSpec spec;
    std::string name = piece;
    std::string slot_list;
    bool has_slots = false;
    if (index.count(piece) == 0) {
      size_t colon = piece.rfind(':');
      if (colon != std::string::npos) {
        name = piece.substr(0, colon);
        slot_list = piece.substr(colon + 1);
        has_slots = true;
      }
    }
    if (name.empty()) {
      return Status::InvalidArgument(prefix + "NODE_SPEC " + Quote(piece) + " has no host name; expected " +
                                     kSpecFormat);
    }
    auto it = index.find(name);
    if (it == index.end()) {
      return Status::InvalidArgument(prefix + "unknown host " + Quote(name) + "; the hostfile lists " +
                                     KnownHosts(hosts));
    }
    spec.host = it->second;
    const HostEntry& h = hosts[spec.host];
    if (has_slots) {
      spec.all_slots = false;
      for (const std::string& s : Split(slot_list, ',')) {
        long long v = 0;
        if (!ParseBoundedInt(s, kMaxSlotsPerHost, &v)) {
          return Status::InvalidArgument(prefix + "expected a slot number in " + Quote(piece) + ", got " + Quote(s) +
                                         " (" + kSpecFormat + ")");
        }
        if (v >= h.slots) {
          return Status::InvalidArgument(prefix + "slot " + s + " is out of range for host " + Quote(h.host) +
                                         ", which has slots 0-" + std::to_string(h.slots - 1));
        }
        spec.slots.push_back(static_cast<int>(v));
      }
    }
    out->push_back(std::move(spec));
  }
  return Status::Ok();
}

void AppendJsonString(const std::string& s, std::string* out) {
  // As Python's json.dumps for ASCII; other bytes pass through as UTF-8
  // (valid JSON, and host names are ASCII anyway).
  static const char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          *out += "\\u00";
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0xf]);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

std::string UrlsafeBase64(const std::string& raw) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  out.reserve((raw.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= raw.size(); i += 3) {
    uint32_t v = (static_cast<uint32_t>(static_cast<unsigned char>(raw[i])) << 16) |
                 (static_cast<uint32_t>(static_cast<unsigned char>(raw[i + 1])) << 8) |
                 static_cast<uint32_t>(static_cast<unsigned char>(raw[i + 2]));
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back(kAlphabet[v & 63]);
  }
  size_t rest = raw.size() - i;
  if (rest > 0) {
    uint32_t v = static_cast<uint32_t>(static_cast<unsigned char>(raw[i])) << 16;
    if (rest == 2) v |= static_cast<uint32_t>(static_cast<unsigned char>(raw[i + 1])) << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

}  // namespace

Status ParseHostfileText(const std::string& text, const std::string& source, std::vector<HostEntry>* out) {
  std::vector<HostEntry> hosts;
  std::map<std::string, int> first_line;
  int line_no = 0;
  for (const std::string& raw_line : Split(text, '\n')) {
    ++line_no;
    std::string line = raw_line.substr(0, raw_line.find('#'));
    line = Trim(line);
    if (line.empty()) continue;
    std::vector<std::string> words = SplitWords(line);
    const std::string expected = std::string("expected ") + kLineFormat + ", got " + Quote(line);
    if (words.size() < 2 || words.size() > 3) return LineError(source, line_no, expected);
    HostEntry e;
    e.host = words[0];
    e.line = line_no;
    const std::string& slots_word = words[1];
    long long slots = 0;
    if (slots_word.compare(0, 6, "slots=") != 0 || !ParseBoundedInt(slots_word.substr(6), kMaxSlotsPerHost, &slots)) {
      return LineError(source, line_no, expected);
    }
    if (slots < 1 || slots > kMaxSlotsPerHost) {
      return LineError(source, line_no,
                       "host " + Quote(e.host) + ": expected slots=N with N from 1 to " +
                           std::to_string(kMaxSlotsPerHost) + ", got " + Quote(slots_word));
    }
    e.slots = static_cast<int>(slots);
    if (words.size() == 3) {
      const std::string& rack_word = words[2];
      if (rack_word.compare(0, 5, "rack=") != 0 || rack_word.size() == 5) return LineError(source, line_no, expected);
      e.rack = rack_word.substr(5);
    }
    auto [it, inserted] = first_line.emplace(e.host, line_no);
    if (!inserted) {
      return LineError(source, line_no,
                       "host " + Quote(e.host) + " is listed twice (first on line " + std::to_string(it->second) +
                           "); expected each host once");
    }
    hosts.push_back(std::move(e));
  }
  if (hosts.empty()) {
    return Status::InvalidArgument(source + ": no hosts; expected lines " + kLineFormat);
  }
  *out = std::move(hosts);
  return Status::Ok();
}

Status ParseHostfile(const std::string& path, std::vector<HostEntry>* out) {
  std::string text;
  FTRUN_RETURN_IF_ERROR(ReadWholeFile(path, "hostfile " + Quote(path), &text));
  return ParseHostfileText(text, path, out);
}

Status SelectNodes(const std::vector<HostEntry>& hosts, const std::string& include, const std::string& exclude,
                   int num_nodes, int num_gpus, std::vector<NodeSlots>* out) {
  if (!include.empty() && !exclude.empty()) {
    return Status::InvalidArgument("--include and --exclude are mutually exclusive; give one or the other");
  }
  const char* filter_flag = !include.empty() ? "--include" : !exclude.empty() ? "--exclude" : nullptr;
  if (filter_flag != nullptr && (num_nodes > 0 || num_gpus > 0)) {
    return Status::InvalidArgument(std::string(filter_flag) + " cannot be combined with " +
                                   (num_nodes > 0 ? "--num_nodes" : "--num_gpus") +
                                   "; pick hosts and slots with one or the other");
  }
  if (hosts.empty()) return Status::InvalidArgument("no hosts to select from; expected at least one hostfile entry");

  // Selected slots per host, by hostfile index; empty = host not selected.
  std::vector<std::set<int>> chosen(hosts.size());
  if (filter_flag == nullptr || !exclude.empty()) {
    for (size_t i = 0; i < hosts.size(); ++i) {
      for (int s = 0; s < hosts[i].slots; ++s) chosen[i].insert(s);
    }
  }
  if (filter_flag != nullptr) {
    std::vector<NodeSpec> specs;
    FTRUN_RETURN_IF_ERROR(ParseNodeSpecs(filter_flag, include.empty() ? exclude : include, hosts, &specs));
    for (const NodeSpec& spec : specs) {
      std::set<int>& set = chosen[spec.host];
      if (!include.empty()) {
        if (spec.all_slots) {
          for (int s = 0; s < hosts[spec.host].slots; ++s) set.insert(s);
        } else {
          set.insert(spec.slots.begin(), spec.slots.end());
        }
      } else if (spec.all_slots) {
        set.clear();
      } else {
        for (int s : spec.slots) set.erase(s);
      }
    }
  }

  std::vector<NodeSlots> nodes;
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (chosen[i].empty()) continue;
    nodes.push_back(NodeSlots{hosts[i].host, std::vector<int>(chosen[i].begin(), chosen[i].end()), hosts[i].rack});
  }
  if (nodes.empty()) {
    return Status::InvalidArgument("--exclude " + Quote(exclude) + " leaves no slots; expected at least one to remain");
  }
  if (num_nodes > 0) {
    if (static_cast<size_t>(num_nodes) > nodes.size()) {
      return Status::InvalidArgument("--num_nodes " + std::to_string(num_nodes) + " but only " +
                                     std::to_string(nodes.size()) + " hosts are available (" + KnownHosts(hosts) + ")");
    }
    nodes.resize(static_cast<size_t>(num_nodes));
  }
  if (num_gpus > 0) {
    for (NodeSlots& n : nodes) {
      if (n.slots.size() < static_cast<size_t>(num_gpus)) {
        return Status::InvalidArgument("--num_gpus " + std::to_string(num_gpus) + " but host " + Quote(n.host) +
                                       " has only " + std::to_string(n.slots.size()) + " slots");
      }
      n.slots.resize(static_cast<size_t>(num_gpus));
    }
  }
  *out = std::move(nodes);
  return Status::Ok();
}

std::string EncodeWorldInfo(const std::vector<NodeSlots>& nodes) {
  std::string json = "{";
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i > 0) json += ", ";
    AppendJsonString(nodes[i].host, &json);
    json += ": [";
    for (size_t j = 0; j < nodes[i].slots.size(); ++j) {
      if (j > 0) json += ", ";
      json += std::to_string(nodes[i].slots[j]);
    }
    json += "]";
  }
  json += "}";
  return UrlsafeBase64(json);
}

int TotalSlots(const std::vector<NodeSlots>& nodes) {
  int total = 0;
  for (const NodeSlots& n : nodes) total += static_cast<int>(n.slots.size());
  return total;
}

}  // namespace ftrun
