// Where a job's coordinator leadership lives in etcd, and what its keys
// hold: one rule for the runner that leads (launcher/runner/leadership.h)
// and the agents that follow it (launcher/agent/leader_watch.h).
//
//   PREFIX/JOB/leader  {"address", "pid", "host"} under the leader's lease;
//                      its create_revision is the leader's term
//   PREFIX/JOB/state   what a successor needs (the runner's command line,
//                      its agents, the committed version, the epoch)
//   PREFIX/JOB/end     {"exit_code", "message"} once the job has ended
#pragma once

#include <cstdint>
#include <string>

#include "ftrun/status.h"
#include "plugin/config/config.h"
#include "plugin/etcd/etcd_client.h"

namespace ftrun {

struct JobKeys {
  std::string leader, state, end;
};
JobKeys KeysOf(const CoordinatorConfig& c, const std::string& job);

EtcdOptions EtcdOptionsOf(const CoordinatorConfig& c);
inline bool UsesEtcd(const CoordinatorConfig& c) { return !c.etcd_endpoints.empty(); }

struct LeaderRecord {
  std::string address;  // the coordinator's transport address; "" while it starts
  int64_t pid = 0;
  std::string host;
  int64_t term = 0;  // the key's create_revision (not in the value)
};
std::string EncodeLeader(const LeaderRecord& r);
// A value written by anyone who can write the prefix: checked, and an error
// names the key and what is wrong.
Status DecodeLeader(const std::string& key, const EtcdValue& v, LeaderRecord* out);

}  // namespace ftrun
