#include "launcher/agent/options.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "launcher/common/job_id.h"

namespace ftrun {

namespace {

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-' || c == '+') return 62;
  if (c == '_' || c == '/') return 63;
  return -1;
}

}  // namespace

Status DecodeWorldInfo(const std::string& b64, std::vector<std::pair<std::string, std::vector<int>>>* out) {
  std::string raw;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : b64) {
    if (c == '=') break;
    int v = Base64Value(c);
    if (v < 0)
      return Status::InvalidArgument("--world_info: not urlsafe base64 (bad character '" + std::string(1, c) + "')");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      raw.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  // Keep the hostfile order: parse as an ordered json.
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(raw, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.empty()) {
    return Status::InvalidArgument("--world_info: expected base64 of a JSON object {\"host\": [slot, ...]}, got '" +
                                   raw + "'");
  }
  out->clear();
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::vector<int> slots;
    if (!it.value().is_array() || it.value().empty()) {
      return Status::InvalidArgument("--world_info: host '" + it.key() + "' must map to a non-empty list of slot ids");
    }
    for (const auto& s : it.value()) {
      if (!s.is_number_integer())
        return Status::InvalidArgument("--world_info: host '" + it.key() + "' has a non-integer slot");
      slots.push_back(s.get<int>());
    }
    out->emplace_back(it.key(), std::move(slots));
  }
  return Status::Ok();
}

Status ParseAgentOptions(int argc, char** argv, AgentOptions* out, bool* help) {
  *help = false;
  CLI::App app{
      "ftrun-agent: runs and supervises one node's training ranks, holding their snapshots in shared memory.\n"
      "Usage: ftrun-agent [options] SCRIPT [ARGS...]"};
  app.prefix_command();
  std::string config_path, run_dir, log_level, world_info, job_id;
  int nproc = 0;
  AgentOptions o;
  app.add_option("--config", config_path, "ftrun YAML config (default: built-in defaults, see configs/default.yaml)");
  app.add_option("--nproc,--nproc_per_node,--num_gpus", nproc, "ranks on this node (default: agent.ranks_per_node)");
  app.add_option("--job-id", job_id, "job id shared by every node (default: $FTRUN_JOB_ID or a random one)");
  app.add_option("--run-dir", run_dir, "directory for the agent socket and lock (overrides agent.run_dir)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error (overrides agent.log_level)");
  app.add_option("--status-file", o.status_file, "write the job status as JSON here");
  app.add_option("--world_info", world_info, "DeepSpeed world info (urlsafe base64 JSON {host: [slots]})");
  app.add_option("--node_rank", o.node_rank, "this node's index in the world")->check(CLI::NonNegativeNumber);
  app.add_option("--master_addr", o.master_addr, "rendezvous address given to ranks");
  app.add_option("--master_port", o.master_port, "rendezvous port given to ranks")->check(CLI::Range(1, 65535));
  app.add_flag("--module", o.module, "run SCRIPT as a Python module (python -m)");
  app.add_flag("--no_python", o.no_python, "exec SCRIPT directly, without the Python interpreter");
  app.add_flag("--no_local_rank", o.no_local_rank, "do not append --local_rank=N to the script's arguments");
  app.add_option("--save_pid", o.save_pid, "write the agent pid to /tmp/<save_pid>.deepspeed");
  app.add_option("--enable_each_rank_log", o.each_rank_log_dir, "write each rank's output to DIR/rank<N>.log");
  app.add_option("--coordinator", o.coordinator,
                 "coordinator address IP:PORT (multi-node jobs; set by the ftrun runner)");
  app.add_option("--agent-id", o.agent_id, "this agent's id in the job (default: --node_rank)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--secret-file", o.secret_file,
                 "file holding the job secret (mode 0600; required with --coordinator)");
  app.add_option("--listen", o.listen_ip, "IPv4 address peer agents reach this agent at (default 127.0.0.1)");
  app.add_flag("--spare", o.spare, "start without ranks, ready to take over a lost node");
  app.add_option("--rack", o.rack, "failure domain of this node (placement keeps copies in other racks)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    *help = true;
    return Status::InvalidArgument(app.help());
  } catch (const CLI::ParseError& e) {
    return Status::InvalidArgument(std::string("ftrun-agent: ") + e.what() + "\nRun with --help for usage.");
  }
  o.command = app.remaining();
  if (!o.command.empty() && o.command.front() == "--") o.command.erase(o.command.begin());
  if (o.command.empty()) return Status::InvalidArgument("ftrun-agent: no training command given (SCRIPT [ARGS...])");

  if (config_path.empty()) {
    o.config = DefaultConfig();
  } else {
    FTRUN_RETURN_IF_ERROR(LoadConfigFile(config_path, &o.config));
  }
  if (!run_dir.empty()) o.config.agent.run_dir = run_dir;
  if (!log_level.empty()) o.config.agent.log_level = log_level;

  if (!world_info.empty()) {
    std::vector<std::pair<std::string, std::vector<int>>> world;
    FTRUN_RETURN_IF_ERROR(DecodeWorldInfo(world_info, &world));
    if (o.node_rank >= static_cast<int>(world.size())) {
      return Status::InvalidArgument("--node_rank " + std::to_string(o.node_rank) + " but --world_info lists " +
                                     std::to_string(world.size()) + " hosts");
    }
    o.num_nodes = static_cast<int>(world.size());
    o.world_size = 0;
    for (int i = 0; i < o.num_nodes; ++i) {
      if (i == o.node_rank) o.first_global_rank = o.world_size;
      o.world_size += static_cast<int>(world[static_cast<size_t>(i)].second.size());
    }
    o.slots = world[static_cast<size_t>(o.node_rank)].second;
    o.local_ranks = static_cast<int>(o.slots.size());
    if (nproc > 0 && nproc != o.local_ranks) {
      return Status::InvalidArgument("--nproc " + std::to_string(nproc) +
                                     " disagrees with --world_info, which gives node " + std::to_string(o.node_rank) +
                                     " " + std::to_string(o.local_ranks) + " slots");
    }
  } else {
    o.local_ranks = nproc > 0 ? nproc : o.config.agent.ranks_per_node;
    o.world_size = o.local_ranks;
    for (int i = 0; i < o.local_ranks; ++i) o.slots.push_back(i);
  }
  o.config.agent.ranks_per_node = o.local_ranks;
  FTRUN_RETURN_IF_ERROR(ValidateConfig(o.config));

  if (o.agent_id < 0) o.agent_id = o.node_rank;
  if (!o.coordinator.empty() && o.secret_file.empty()) {
    return Status::InvalidArgument(
        "ftrun-agent: --coordinator needs --secret-file (the job secret is never passed on "
        "the command line)");
  }
  if (o.coordinator.empty() && o.spare) return Status::InvalidArgument("ftrun-agent: --spare needs --coordinator");
  o.job_id = job_id;
  if (o.job_id.empty() && !o.config.job.id.empty()) o.job_id = o.config.job.id;
  if (const char* env = std::getenv("FTRUN_JOB_ID"); o.job_id.empty() && env != nullptr) o.job_id = env;
  if (o.job_id.empty()) o.job_id = NewJobId();
  FTRUN_RETURN_IF_ERROR(CheckJobId(o.job_id));
  *out = std::move(o);
  return Status::Ok();
}

}  // namespace ftrun
