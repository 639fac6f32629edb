// The job's state in etcd, signed: what a standby coordinator runs, adopts
// and kills comes from there (the command line, the status file, the
// agents' pids), and anyone who can write the job's etcd prefix could
// write it (etcd on loopback without auth: any local user). The leader
// signs it with the job secret, which only the job's user can read
// (secret.h); a standby checks the signature with the secret it reads
// itself, from its own agent.run_dir, before it believes a word of it.
//
// The key's value: {"state": "<the state, as JSON text>", "mac": "<hex>"},
// mac = HMAC-SHA256(secret, "etcd-state|" + job id + "|" + state), so a
// state signed for one job is no good for another.
#pragma once

#include <string>

#include "ftrun/status.h"

namespace ftrun {

// The value to write for `state` of job `job`.
std::string SignState(const std::string& secret, const std::string& job, const std::string& state);

// The state in `value` (what the key held) into *state, if the job secret
// signed it for `job`. `where` names the key in errors; `secret_from`, the
// secret file (for the error that says who could have written it).
Status VerifyState(const std::string& secret, const std::string& secret_from, const std::string& job,
                   const std::string& value, const std::string& where, std::string* state);

}  // namespace ftrun
