#include "launcher/runner/runner_options.h"

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "launcher/runner/remote_command.h"
#include "plugin/config/config_keys.h"

namespace ftrun {
namespace {

constexpr const char* kLaunchers[] = {"pdsh", "openmpi", "mvapich", "slurm", "mpich", "impi", "local", "ssh"};
constexpr const char* kLogLevels[] = {"trace", "debug", "info", "warn", "error"};

using config_keys::Quote;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

template <size_t N>
std::string JoinChoices(const char* const (&choices)[N]) {
  std::string s;
  for (size_t i = 0; i < N; ++i) s += (i > 0 ? "|" : "") + std::string(choices[i]);
  return s;
}

template <size_t N>
bool OneOf(const std::string& v, const char* const (&choices)[N]) {
  return std::find(std::begin(choices), std::end(choices), v) != std::end(choices);
}

Status Usage(const std::string& what) {
  return Status::InvalidArgument("ftrun: " + what + "\nRun 'ftrun --help' for usage.");
}

// Checks "N" / "N-M" items separated by ',' (DeepSpeed's --bind_core_list).
bool ValidCoreList(const std::string& s) {
  if (s.empty()) return false;
  size_t start = 0;
  for (;;) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t dash = item.find('-');
    std::string a = item.substr(0, dash);
    std::string b = dash == std::string::npos ? a : item.substr(dash + 1);
    auto digits = [](const std::string& t) {
      return !t.empty() && t.size() <= 9 &&
             std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!digits(a) || !digits(b) || std::stol(a) > std::stol(b)) return false;
    if (comma == std::string::npos) return true;
    start = comma + 1;
  }
}

// A flag the pre-scan knows: the CLI11 option, its canonical long name and
// whether it takes a value.
struct FlagInfo {
  const CLI::Option* opt = nullptr;
  std::string canonical;  // "--hostfile"
  bool takes_value = false;
  bool is_int = false;
};

// A decimal int, optionally signed (what argparse's type=int takes, less
// its whitespace and '_' leniency).
bool IsInt(const std::string& v) {
  size_t i = (!v.empty() && (v[0] == '-' || v[0] == '+')) ? 1 : 0;
  if (i >= v.size() || v.size() - i > 9) return false;  // 9 digits fit in an int
  return std::all_of(v.begin() + static_cast<long>(i), v.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Walks argv before CLI11 sees it: finds where the script starts, expands
// unique prefixes of long flags, and rewrites each flag with a value into
// one "--name=value" word (or "--name" "" for an empty value), so values
// that start with '-' are not mistaken for flags. Sets *help_seen on
// -h/--help.
Status PreScan(int argc, char** argv, const CLI::App& app, std::vector<std::string>* cli_args,
               std::vector<std::string>* command, bool* help_seen) {
  std::map<std::string, FlagInfo> by_long;
  std::map<char, FlagInfo> by_short;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_positional()) continue;
    FlagInfo info;
    info.opt = opt;
    info.takes_value = opt->get_expected_max() > 0;
    info.is_int = opt->get_type_name() == "INT";
    info.canonical = opt->get_lnames().empty() ? "-" + opt->get_snames().front() : "--" + opt->get_lnames().front();
    for (const std::string& l : opt->get_lnames()) by_long["--" + l] = info;
    for (const std::string& s : opt->get_snames()) by_short[s[0]] = info;
  }

  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the script ("-" alone too)
    const FlagInfo* info = nullptr;
    std::string shown;  // the flag as the user wrote it, for messages
    std::string value;
    bool has_value = false;
    if (arg[1] == '-') {
      size_t eq = arg.find('=');
      shown = arg.substr(0, eq);
      if (eq != std::string::npos) {
        has_value = true;
        value = arg.substr(eq + 1);
      }
      if (shown.size() <= 2) return Usage("unknown flag " + Quote(arg));
      auto it = by_long.find(shown);
      if (it != by_long.end()) {
        info = &it->second;
      } else {
        // argparse accepts any unique prefix of a long flag.
        std::vector<const FlagInfo*> matches;
        std::string names;
        for (auto m = by_long.lower_bound(shown); m != by_long.end() && m->first.compare(0, shown.size(), shown) == 0;
             ++m) {
          names += (names.empty() ? "" : ", ") + m->first;
          if (std::none_of(matches.begin(), matches.end(),
                           [&](const FlagInfo* f) { return f->opt == m->second.opt; })) {
            matches.push_back(&m->second);
          }
        }
        if (matches.size() > 1) return Usage("ambiguous flag " + Quote(shown) + ": could be " + names);
        if (matches.empty()) return Usage("unknown flag " + Quote(shown));
        info = matches.front();
      }
    } else {
      auto it = by_short.find(arg[1]);
      shown = arg.substr(0, 2);
      if (it == by_short.end()) return Usage("unknown flag " + Quote(shown));
      info = &it->second;
      if (arg.size() > 2) {
        if (!info->takes_value) return Usage(shown + " takes no value, got " + Quote(arg));
        has_value = true;
        value = arg.substr(arg[2] == '=' ? 3 : 2);
      }
    }
    if (info->opt == app.get_help_ptr()) {
      *help_seen = true;
      return Status::Ok();
    }
    if (!info->takes_value) {
      if (has_value) return Usage(info->canonical + " takes no value, got " + Quote(arg));
      cli_args->push_back(info->canonical);
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) return Usage(info->canonical + ": expected a value after it");
      value = argv[++i];
    }
    if (info->is_int) {
      if (!IsInt(value)) return Usage(info->canonical + ": expected an integer, got " + Quote(value));
      value = std::to_string(std::stol(value));  // "010" is 10, not CLI11's octal 8
    }
    if (value.empty()) {
      cli_args->push_back(info->canonical);
      cli_args->push_back("");
    } else {
      cli_args->push_back(info->canonical + "=" + value);
    }
  }
  command->assign(argv + std::min(i, argc), argv + argc);
  return Status::Ok();
}

std::string HelpText(const CLI::App& app) {
  std::string text = app.help();
  const std::string cli_usage = "Usage: ftrun [OPTIONS]";
  size_t pos = text.find(cli_usage);
  if (pos != std::string::npos) text.replace(pos, cli_usage.size(), "Usage: ftrun [options] SCRIPT [ARGS...]");
  return text;
}

Status Validate(RunnerOptions* o) {
  o->launcher = Lower(o->launcher);
  if (!OneOf(o->launcher, kLaunchers)) {
    return Usage("--launcher: expected one of " + JoinChoices(kLaunchers) + ", got " + Quote(o->launcher));
  }
  o->log_level = Lower(o->log_level);
  if (o->log_level == "warning") o->log_level = "warn";
  if (!OneOf(o->log_level, kLogLevels)) {
    return Usage("--log_level: expected one of " + JoinChoices(kLogLevels) + ", got " + Quote(o->log_level));
  }
  if (o->hostfile.empty()) return Usage("--hostfile: expected a file path, got ''");
  if (o->num_nodes == 0 || o->num_nodes < -1) {
    return Usage("--num_nodes: expected a number of nodes >= 1, got " + std::to_string(o->num_nodes));
  }
  if (o->num_gpus == 0 || o->num_gpus < -1) {
    return Usage("--num_gpus: expected a number of slots per node >= 1, got " + std::to_string(o->num_gpus));
  }
  if (o->master_port < 1 || o->master_port > 65535) {
    return Usage("--master_port: expected a port from 1 to 65535, got " + std::to_string(o->master_port));
  }
  if (o->node_rank < -1) return Usage("--node_rank: expected a node index >= 0, got " + std::to_string(o->node_rank));
  if (o->ssh_port != -1 && (o->ssh_port < 1 || o->ssh_port > 65535)) {
    return Usage("--ssh_port: expected a port from 1 to 65535, got " + std::to_string(o->ssh_port));
  }
  if (o->spares < -1) return Usage("--spares: expected a number of spare nodes >= 0, got " + std::to_string(o->spares));
  if (o->enable_each_rank_log == "None") o->enable_each_rank_log.clear();  // DeepSpeed's "off"
  if (!o->bind_core_list.empty() && !ValidCoreList(o->bind_core_list)) {
    return Usage("--bind_core_list: expected core ids like '0-15,32,40-47', got " + Quote(o->bind_core_list));
  }
  if (o->agent_addr.empty()) return Usage("--agent_addr: expected an address template, got ''");
  if (o->coordinator_addr.empty()) return Usage("--coordinator_addr: expected an address, got ''");

  if (!o->include.empty() && !o->exclude.empty()) return Usage("--include and --exclude are mutually exclusive");
  const char* filter = !o->include.empty() ? "--include" : !o->exclude.empty() ? "--exclude" : nullptr;
  if (filter != nullptr && (o->num_nodes > 0 || o->num_gpus > 0)) {
    return Usage(std::string(filter) + " cannot be combined with " + (o->num_nodes > 0 ? "--num_nodes" : "--num_gpus") +
                 "; pick hosts and slots with one or the other");
  }
  if (o->module && o->no_python) return Usage("--module and --no_python are mutually exclusive");
  if (o->no_ssh && o->launcher == "ssh") return Usage("--no_ssh cannot be combined with --launcher ssh");

  std::vector<std::string> words;
  Status s = ShellSplit(o->launcher_args, &words);
  if (!s.ok()) return Usage("--launcher_args: " + s.message());
  s = ShellSplit(o->agent_exec_prefix, &words);
  if (!s.ok()) return Usage("--agent_exec_prefix: " + s.message());
  return Status::Ok();
}

}  // namespace

Status ParseRunnerOptions(int argc, char** argv, RunnerOptions* out, bool* help) {
  *help = false;
  RunnerOptions o;
  CLI::App app{
      "ftrun: fault-tolerant training launcher, a drop-in for DeepSpeed's `deepspeed` runner.\n"
      "Flags come before SCRIPT; SCRIPT and everything after it go to the script untouched.",
      "ftrun"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  // DeepSpeed's runner flags.
  app.add_option("-H,--hostfile", o.hostfile,
                 "hostfile: lines 'HOST slots=N [rack=NAME]' (default /job/hostfile; if that is missing, "
                 "one localhost node)");
  app.add_option("-i,--include", o.include, "use only these: NODE_SPEC[@NODE_SPEC...], NODE_SPEC=NAME[:SLOT[,SLOT]]");
  app.add_option("-e,--exclude", o.exclude, "use all but these: NODE_SPEC[@NODE_SPEC...]");
  app.add_option("--num_nodes", o.num_nodes, "use the first N hosts of the hostfile (default: all)");
  app.add_option("--num_gpus,--num_accelerators", o.num_gpus, "use the first N slots of each host (default: all)");
  app.add_option("--master_addr", o.master_addr, "rendezvous address for the ranks (default: the first host)");
  app.add_option("--master_port", o.master_port, "rendezvous port for the ranks (default 29500)");
  app.add_option("--node_rank", o.node_rank, "this node's index, with --no_ssh (default -1)");
  app.add_option("--launcher", o.launcher, "how agents are started: " + JoinChoices(kLaunchers) + " (default local)");
  app.add_option("--launcher_args", o.launcher_args, "extra arguments for the launcher, one shell-quoted string");
  app.add_flag("--module", o.module, "run SCRIPT as a Python module (python -m)");
  app.add_flag("--no_python", o.no_python, "exec SCRIPT directly, without the Python interpreter");
  app.add_flag("--no_local_rank", o.no_local_rank, "do not append --local_rank=N to the script's arguments");
  app.add_flag("--no_ssh", o.no_ssh, "start only this node's agent (use with --node_rank and --master_addr)");
  app.add_flag("--no_ssh_check", o.no_ssh_check, "accepted for DeepSpeed compatibility; no effect");
  app.add_flag("--force_multi", o.force_multi, "use the multi-node launcher even for one node");
  app.add_flag("--save_pid", o.save_pid, "write the runner's pid to /tmp/<pid>.deepspeed");
  app.add_option("--enable_each_rank_log", o.enable_each_rank_log, "write each rank's output to DIR");
  app.add_flag("--bind_cores_to_rank", o.bind_cores_to_rank, "bind each rank to its share of the CPU cores");
  app.add_option("--bind_core_list", o.bind_core_list, "cores to share out with --bind_cores_to_rank, e.g. 0-15,32-47");
  app.add_option("--ssh_port", o.ssh_port, "ssh port of the remote nodes");
  app.add_option("--log_level", o.log_level, "trace|debug|info|warn|error (default info)");
  app.add_flag("-q,--quiet", o.quiet, "print only warnings and errors");

  // ftrun's own flags.
  app.add_option("--config", o.config, "ftrun YAML config (default: built-in defaults, see configs/default.yaml)");
  app.add_option("--spares", o.spares, "spare nodes held back to replace failed ones (default: from the config)");
  app.add_option("--status_file", o.status_file, "write the job status as JSON here");
  app.add_option("--agent_exec_prefix", o.agent_exec_prefix,
                 "prefix of each agent's command line, '{node}' -> node index (e.g. 'ip netns exec ns{node}')");
  app.add_option("--agent_addr", o.agent_addr,
                 "address each agent listens on for peers, '{node}' -> node index "
                 "(default 127.0.0.1)");
  app.add_option("--coordinator_addr", o.coordinator_addr,
                 "address the runner's coordinator listens on "
                 "(default 127.0.0.1)");

  std::vector<std::string> cli_args;
  bool help_seen = false;
  FTRUN_RETURN_IF_ERROR(PreScan(argc, argv, app, &cli_args, &o.command, &help_seen));
  if (help_seen) {
    *help = true;
    return Status::InvalidArgument(HelpText(app));
  }
  std::reverse(cli_args.begin(), cli_args.end());  // CLI11 takes the words last-first
  try {
    app.parse(cli_args);
  } catch (const CLI::CallForHelp&) {
    *help = true;
    return Status::InvalidArgument(HelpText(app));
  } catch (const CLI::ParseError& e) {
    return Usage(e.what());
  }
  o.hostfile_given = app.get_option("--hostfile")->count() > 0;
  FTRUN_RETURN_IF_ERROR(Validate(&o));
  if (o.command.empty()) return Usage("no training script given; expected ftrun [options] SCRIPT [ARGS...]");
  o.argv.assign(argv + 1, argv + argc);
  *out = std::move(o);
  return Status::Ok();
}

Status LoadHosts(const RunnerOptions& o, std::vector<HostEntry>* out) {
  if (!o.hostfile_given) {
    struct stat st;
    if (::stat(o.hostfile.c_str(), &st) != 0 && (errno == ENOENT || errno == ENOTDIR)) {
      HostEntry local;
      local.host = "localhost";
      local.slots = o.num_gpus > 0 ? o.num_gpus : 1;
      *out = {local};
      return Status::Ok();
    }
  }
  Status s = ParseHostfile(o.hostfile, out);
  if (s.code() == Code::kIoError) return s.Annotate(o.hostfile_given ? "--hostfile" : "default hostfile");
  return s;
}

std::string ResolveMasterAddr(const RunnerOptions& o, const std::vector<NodeSlots>& nodes) {
  if (!o.master_addr.empty()) return o.master_addr;
  if (nodes.empty() || (nodes.size() == 1 && nodes[0].host == "localhost")) return "127.0.0.1";
  return nodes[0].host;
}

Status ParseSavedCommandLine(const std::string& json_text, const std::string& where, RunnerOptions* out) {
  const nlohmann::json saved = nlohmann::json::parse(json_text, nullptr, false);
  if (saved.is_discarded() || !saved.is_object() || !saved.contains("argv") || !saved["argv"].is_array())
    return Status::InvalidArgument(where + ": expected {\"argv\": [...]} written by the job's runner");
  std::vector<std::string> words{"ftrun"};
  for (const auto& w : saved["argv"]) {
    if (!w.is_string()) return Status::InvalidArgument(where + ": 'argv' holds a non-string");
    words.push_back(w.get<std::string>());
  }
  std::vector<char*> cargv;
  for (auto& w : words) cargv.push_back(w.data());
  bool help = false;
  Status s = ParseRunnerOptions(static_cast<int>(cargv.size()), cargv.data(), out, &help);
  if (!s.ok()) return Status::InvalidArgument(where + ": " + s.message());
  if (saved.contains("cwd")) {
    if (!saved["cwd"].is_string() || saved["cwd"].get<std::string>().rfind('/', 0) != 0)
      return Status::InvalidArgument(where + ": 'cwd' must be an absolute directory");
    out->saved_cwd = saved["cwd"].get<std::string>();
  }
  return Status::Ok();
}

std::string CurrentDirectory() {
  char cwd[4096];
  return ::getcwd(cwd, sizeof(cwd) - 1) ? cwd : ".";
}

Status EnterSavedDirectory(const RunnerOptions& o) {
  if (o.saved_cwd.empty() || ::chdir(o.saved_cwd.c_str()) == 0) return Status::Ok();
  return Status::FromErrno("cannot enter " + o.saved_cwd +
                               ", the directory the job's command line was given in (its relative paths mean "
                               "files there)",
                           errno);
}

}  // namespace ftrun
