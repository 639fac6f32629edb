// RunnerOptions: the `ftrun` command line, a drop-in for DeepSpeed's
// `deepspeed` runner (docs: /work/shared/INTEGRATION.md section 1):
//
//   ftrun [runner flags] SCRIPT [ARGS...]
//
// Flags come before the script. The first word that is not a flag or a
// flag's value is the script; it and everything after it go to `command`
// untouched, even words that look like flags. "--" ends the flags
// explicitly. As with Python's argparse (which DeepSpeed uses), a flag's
// value may follow as the next word or after '=' ("--master_port 29600",
// "--master_port=29600", "-H file", "-Hfile"), a value may start with '-'
// ("--launcher_args '-N 4'", "--node_rank -1"), a flag given twice keeps the
// last value, and a long flag may be shortened to any unique prefix
// ("--num_node 2").
//
// DeepSpeed's flags keep their names, defaults and meaning; ftrun's own
// flags do not clash with them. --no_ssh_check is accepted and ignored (ftrun
// checks reachability itself). Flags DeepSpeed has but ftrun does not
// implement (--autotuning, --elastic_training, --min/max_elastic_nodes) are
// refused as unknown rather than silently ignored.
//
// Errors are InvalidArgument whose message names the flag(s) and what was
// expected. Functions are thread-safe and never throw.
#pragma once

#include <string>
#include <vector>

#include "ftrun/status.h"
#include "launcher/runner/hostfile.h"

namespace ftrun {

// DeepSpeed's default hostfile (DLTS_HOSTFILE).
constexpr char kDefaultHostfile[] = "/job/hostfile";

struct RunnerOptions {
  // --- DeepSpeed runner flags ---
  std::string hostfile = kDefaultHostfile;  // -H/--hostfile
  bool hostfile_given = false;              // -H/--hostfile was on the command line
  std::string include, exclude;             // -i/--include, -e/--exclude
  int num_nodes = -1, num_gpus = -1;        // -1 = all; --num_gpus alias --num_accelerators
  std::string master_addr;                  // "" = see ResolveMasterAddr
  int master_port = 29500;
  int node_rank = -1;
  std::string launcher = "local";  // pdsh|openmpi|mvapich|slurm|mpich|impi|local|ssh (lower-cased)
  std::string launcher_args;       // one string; split with ShellSplit
  bool module = false, no_python = false, no_local_rank = false, no_ssh = false, force_multi = false, save_pid = false;
  bool no_ssh_check = false;         // accepted for compatibility; no effect
  std::string enable_each_rank_log;  // DIR; "" = off (DeepSpeed's "None" is read as "")
  bool bind_cores_to_rank = false;
  std::string bind_core_list;      // e.g. "0-15,32-47"; checked to be N or N-M items
  int ssh_port = -1;               // -1 = ssh's default
  std::string log_level = "info";  // trace|debug|info|warn|error (lower-cased; "warning" -> "warn")
  bool quiet = false;              // -q/--quiet

  // --- ftrun's own flags ---
  std::string config;                          // --config FILE (ftrun YAML); "" = built-in defaults
  int spares = -1;                             // --spares N, >= 0; -1 = take it from the config
  std::string status_file;                     // --status_file FILE: the runner's JSON status
  std::string agent_exec_prefix;               // --agent_exec_prefix 'CMD ARGS': prefix of each agent's command
                                               // line, "{node}" -> node index; split with ShellSplit
  std::string agent_addr = "127.0.0.1";        // --agent_addr TEMPLATE, "{node}" -> node index
  std::string coordinator_addr = "127.0.0.1";  // --coordinator_addr IP

  std::vector<std::string> command;  // SCRIPT and its arguments, untouched

  std::vector<std::string> argv;  // every argument as given (kept for `ftrun --attach`)
  std::string saved_cwd;          // a successor's: the directory that command line was given in
  std::string attach_job;         // set by AttachJob: take over this running job's agents
  std::string attach_state;       // a standby coordinator's: the old leader's state from etcd (JSON)
};

// Parses argv (argv[0] is the program name). On success *out holds the
// options, validated: ranges, the --launcher and --log_level choices,
// mutually exclusive flags (--include/--exclude, either of them with
// --num_nodes/--num_gpus, --module/--no_python, --no_ssh/--launcher ssh),
// and that --launcher_args and --agent_exec_prefix split cleanly.
// On --help/-h (before the script) sets *help and returns InvalidArgument
// whose message is the help text; on a bad command line returns
// InvalidArgument whose message is what to print. *out is written only on
// success.
Status ParseRunnerOptions(int argc, char** argv, RunnerOptions* out, bool* help);

// A job's first command line as its runner saved it for a successor (JSON
// {"argv": [strings], "cwd": "/dir", ...}: runner.json for `ftrun --attach`,
// the etcd state for a standby coordinator), parsed as above. Errors name
// `where`.
Status ParseSavedCommandLine(const std::string& json_text, const std::string& where, RunnerOptions* out);
// A successor runs in the directory the saved command line was given in
// (its relative --config, hostfile and script mean what they meant there).
Status EnterSavedDirectory(const RunnerOptions& o);
// This process's working directory ("." when it cannot be named).
std::string CurrentDirectory();

// The hosts to run on. Reads o.hostfile. When --hostfile was not given and
// the default file does not exist, that is not an error (DeepSpeed runs
// locally then): *out is one entry {"localhost", slots = num_gpus > 0 ?
// num_gpus : 1}. A --hostfile given explicitly but missing or unreadable is
// IoError naming --hostfile and the path; a bad file is InvalidArgument
// naming path:line.
Status LoadHosts(const RunnerOptions& o, std::vector<HostEntry>* out);

// The rendezvous address given to ranks: --master_addr if set; else
// "127.0.0.1" when the only node is "localhost" (the no-hostfile case) or
// there are no nodes; else the first selected host's name.
std::string ResolveMasterAddr(const RunnerOptions& o, const std::vector<NodeSlots>& nodes);

}  // namespace ftrun
