// How the runner starts one agent on its node, for each --launcher.
//
// Every agent is started by its own launcher process (one ssh, pdsh, mpirun
// or srun per agent), so the death of one agent never takes the launcher of
// another with it: there is no shared mpirun whose default is to kill every
// process once one exits, and no srun step spanning nodes that Slurm would
// cancel as a whole. The runner watches each launcher process like a local
// agent, and the coordinator sees the agent's loss over UCX either way.
//
//   local    ftrun-agent ARGS                     (all nodes on this machine)
//   ssh      ssh -o BatchMode=yes [-p PORT] HOST 'cd CWD && exec env VARS ftrun-agent ARGS'
//   pdsh     pdsh -S -R ssh -w HOST 'cd CWD && exec env VARS ftrun-agent ARGS'
//   openmpi  mpirun -n 1 --host HOST --bind-to none --wdir CWD env VARS ftrun-agent ARGS
//   mpich, impi  mpirun -n 1 -hosts HOST -wdir CWD env VARS ftrun-agent ARGS
//   mvapich  mpirun_rsh -np 1 HOST VARS ftrun-agent ARGS
//   slurm    srun --nodes=1 --ntasks=1 --nodelist=HOST --kill-on-bad-exit=0 --cpu-bind=none
//                 --chdir=CWD env VARS ftrun-agent ARGS
// --launcher_args go right before HOST (ssh/pdsh/mvapich) or before the
// command (mpirun, srun).
#pragma once

#include <string>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

struct AgentLaunch {
  std::string launcher;                    // as --launcher, lower-cased
  std::vector<std::string> launcher_args;  // --launcher_args, split
  int ssh_port = -1;                       // --ssh_port; -1: ssh's default
  std::string host;                        // the node's hostfile name
  std::string cwd;                         // the runner's working directory
  std::vector<std::string> env;            // KEY=VAL the agent gets on its node
  std::vector<std::string> agent_argv;     // ftrun-agent and its arguments
  bool as_root = false;                    // Open MPI refuses root without a flag
};

// The launcher's argv that starts l.agent_argv on l.host.
Status BuildLaunchArgv(const AgentLaunch& l, std::vector<std::string>* argv);

// What DeepSpeed's runner forwards to other nodes: variables whose names
// start with NCCL, PYTHON, UCX or MV2 (and FTRUN_), then the KEY=VAL lines
// of `deepspeed_env_files` that exist (later ones win).
std::vector<std::string> ForwardedEnv(char** env, const std::vector<std::string>& deepspeed_env_files);

// One word for a POSIX shell: 'it'\''s'.
std::string ShellQuote(const std::string& word);

// Splits `s` into words the way a POSIX shell does, without expansions:
// blanks separate words; '...' is literal; "..." is literal except that
// backslash escapes $ ` " \ and newline; outside quotes a backslash escapes
// the next character and backslash-newline is removed. '' and "" give an
// empty word. An unterminated quote or a trailing lone backslash is
// InvalidArgument saying so.
Status ShellSplit(const std::string& s, std::vector<std::string>* out);

// Replaces every "{node}" in `tmpl` with `node_index`.
std::string ExpandNodeTemplate(const std::string& tmpl, int node_index);

}  // namespace ftrun
