// The runner's view of the cluster: DeepSpeed's hostfile, its
// --include/--exclude/--num_nodes/--num_gpus node selection, and the
// --world_info string handed to every node's agent.
//
// Hostfile format (DeepSpeed's, plus one optional ftrun field):
//   # comment                 whole-line comments and blank lines are skipped
//   worker-0 slots=8          HOST slots=N   (N >= 1)
//   worker-1 slots=8 rack=r1  ftrun extension: the node's failure domain
//   worker-2 slots=4  # note  trailing comments are skipped too
// A duplicate host, slots < 1, or any other text on a line is an error.
// Errors are InvalidArgument naming "path:line: " and what was expected,
// e.g. "hosts.txt:3: expected 'HOST slots=N [rack=NAME]', got 'foo bar'".
//
// Selection follows DeepSpeed's runner:
//   --include / --exclude  NODE_SPEC[@NODE_SPEC...], NODE_SPEC=NAME[:SLOT[,SLOT...]]
//   --num_nodes N          the first N hosts
//   --num_gpus N           the first N slots of each host
// The result keeps hostfile order and sorted, unique slot ids.
//
// All functions are pure (ParseHostfile reads one file), thread-safe, and
// never throw. *out is written only on success.
#pragma once

#include <string>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

struct HostEntry {
  std::string host;
  int slots = 0;     // >= 1; the host's slot ids are 0..slots-1
  std::string rack;  // optional "rack=NAME" field; "" if absent
  int line = 0;      // 1-based line in the hostfile; 0 if not from a file
};

// Largest slots=N accepted on one host.
constexpr int kMaxSlotsPerHost = 65536;

// Parses hostfile text; `source` names it in messages (usually the path).
// A text without any host is an error (DeepSpeed refuses it too).
Status ParseHostfileText(const std::string& text, const std::string& source, std::vector<HostEntry>* out);

// Reads `path` and parses it. An unreadable file gives IoError naming the
// path and strerror.
Status ParseHostfile(const std::string& path, std::vector<HostEntry>* out);

struct NodeSlots {
  std::string host;
  std::vector<int> slots;  // accelerator ids used on this host, ascending
  std::string rack;
};

// Applies DeepSpeed's node selection to `hosts` (hostfile order):
//   - include and exclude are mutually exclusive, and exclusive with
//     num_nodes > 0 / num_gpus > 0 (the error names both flags);
//   - include keeps only the named hosts (all their slots, or the listed
//     ones; a host named twice gets the union);
//   - exclude drops the named hosts, or only the listed slots of a host;
//     hosts left without slots are dropped, and nothing left is an error;
//   - a host not in `hosts` is an error naming it and listing the known ones;
//     a slot id outside 0..slots-1 is an error;
//   - num_nodes > 0 keeps the first num_nodes hosts (error if fewer);
//   - num_gpus > 0 keeps slots 0..num_gpus-1 of each host (error if a host
//     has fewer). Values <= 0 mean "all".
// A host name may itself contain ':' (IPv6): a NODE_SPEC equal to a known
// host is that whole host, otherwise its slot list starts at the last ':'.
Status SelectNodes(const std::vector<HostEntry>& hosts, const std::string& include, const std::string& exclude,
                   int num_nodes, int num_gpus, std::vector<NodeSlots>* out);

// DeepSpeed's --world_info: urlsafe base64 (with '=' padding) of the JSON
// {"host": [slot, ...], ...} in the order of `nodes`, written exactly as
// Python's json.dumps writes it, so the string is byte-identical to the one
// DeepSpeed's runner would pass. Round-trips with DecodeWorldInfo
// (launcher/agent/options.h).
std::string EncodeWorldInfo(const std::vector<NodeSlots>& nodes);

// Sum of the slots of every node (the world size).
int TotalSlots(const std::vector<NodeSlots>& nodes);

}  // namespace ftrun
