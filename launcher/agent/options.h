// AgentOptions: ftrun-agent's command line, parsed once. It accepts the argv
// of deepspeed.launcher.launch (--world_info, --node_rank, --master_addr,
// --master_port, --module, --no_python, --no_local_rank, --save_pid,
// --enable_each_rank_log, then the script and its arguments), so existing
// pdsh/srun wrappers can start it, plus ftrun's own flags.
#pragma once

#include <string>
#include <vector>

#include "ftrun/status.h"
#include "plugin/config/config.h"

namespace ftrun {

struct AgentOptions {
  Config config;
  std::string job_id;
  int node_rank = 0;
  int num_nodes = 1;
  int local_ranks = 1;
  int first_global_rank = 0;  // global rank of local rank 0
  int world_size = 1;
  std::vector<int> slots;  // accelerator ids of this node (CUDA_VISIBLE_DEVICES)
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // "host:port" of the job's rendezvous store when the runner hosts one
  // (StartMsg::store); "": the generation's rank 0 hosts it.
  std::string rendezvous_store;
  bool module = false;
  bool no_python = false;
  bool no_local_rank = false;
  int save_pid = 0;
  std::string each_rank_log_dir;
  std::string status_file;           // JSON status, rewritten as the job goes
  std::vector<std::string> command;  // script and its arguments

  // Multi-node: set when the agent is part of a cluster run by a coordinator.
  std::string coordinator;              // --coordinator IP:PORT ("" = a one-node job)
  int agent_id = -1;                    // --agent-id (default: --node_rank); unique in the job
  std::string secret_file;              // --secret-file: the job secret (mode 0600)
  std::string listen_ip = "127.0.0.1";  // --listen: address peers reach this agent at
  bool spare = false;                   // --spare: no ranks until the coordinator gives it a lost node's
  std::string rack;                     // --rack: failure domain, for placement
};

// Parses argv. On --help or a bad command line returns kInvalidArgument
// whose message is what to print (help text included for --help, with
// *help set).
Status ParseAgentOptions(int argc, char** argv, AgentOptions* out, bool* help);

// Decodes DeepSpeed's --world_info (urlsafe base64 of {"host": [slots]}).
// Hosts keep their order. Errors say what was expected.
Status DecodeWorldInfo(const std::string& b64, std::vector<std::pair<std::string, std::vector<int>>>* out);

}  // namespace ftrun
