#include "launcher/runner/remote_command.h"

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "plugin/config/config_keys.h"

namespace ftrun {
namespace {

using config_keys::Quote;

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// One shell command line for ssh/pdsh: the remote side runs it with sh.
std::string RemoteShellCommand(const AgentLaunch& l) {
  std::string cmd = "cd " + ShellQuote(l.cwd) + " && exec env";
  for (const auto& kv : l.env) cmd += " " + ShellQuote(kv);
  for (const auto& a : l.agent_argv) cmd += " " + ShellQuote(a);
  return cmd;
}

void Append(std::vector<std::string>* v, const std::vector<std::string>& more) {
  v->insert(v->end(), more.begin(), more.end());
}

}  // namespace

std::string ShellQuote(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                              "_-./:=@%+,") == std::string::npos) {
    return word;
  }
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

Status BuildLaunchArgv(const AgentLaunch& l, std::vector<std::string>* argv) {
  argv->clear();
  if (l.agent_argv.empty()) return Status::InvalidArgument("no agent command to launch");
  if (l.launcher != "local" && l.host.empty()) {
    return Status::InvalidArgument("--launcher " + l.launcher + " needs a host name for every node");
  }
  std::vector<std::string> env_cmd = {"env"};
  Append(&env_cmd, l.env);
  Append(&env_cmd, l.agent_argv);
  if (l.launcher == "local") {
    *argv = l.agent_argv;
  } else if (l.launcher == "ssh") {
    *argv = {"ssh", "-o", "BatchMode=yes"};
    if (l.ssh_port > 0) Append(argv, {"-p", std::to_string(l.ssh_port)});
    Append(argv, l.launcher_args);
    Append(argv, {l.host, RemoteShellCommand(l)});
  } else if (l.launcher == "pdsh") {
    *argv = {"pdsh", "-S", "-R", "ssh", "-w", l.host};
    Append(argv, l.launcher_args);
    argv->push_back(RemoteShellCommand(l));
  } else if (l.launcher == "openmpi") {
    *argv = {"mpirun", "-n", "1", "--host", l.host, "--bind-to", "none", "--wdir", l.cwd};
    if (l.as_root) argv->push_back("--allow-run-as-root");
    Append(argv, l.launcher_args);
    Append(argv, env_cmd);
  } else if (l.launcher == "mpich" || l.launcher == "impi") {
    *argv = {"mpirun", "-n", "1", "-hosts", l.host, "-wdir", l.cwd};
    Append(argv, l.launcher_args);
    Append(argv, env_cmd);
  } else if (l.launcher == "mvapich") {
    *argv = {"mpirun_rsh", "-np", "1"};
    Append(argv, l.launcher_args);
    argv->push_back(l.host);
    Append(argv, l.env);  // mpirun_rsh takes VAR=VAL before the program
    Append(argv, l.agent_argv);
  } else if (l.launcher == "slurm") {
    *argv = {"srun",
             "--nodes=1",
             "--ntasks=1",
             "--nodelist=" + l.host,
             "--kill-on-bad-exit=0",
             "--cpu-bind=none",
             "--chdir=" + l.cwd};
    Append(argv, l.launcher_args);
    Append(argv, env_cmd);
  } else {
    return Status::InvalidArgument("--launcher " + l.launcher + ": no way to start an agent with it");
  }
  return Status::Ok();
}

std::vector<std::string> ForwardedEnv(char** env, const std::vector<std::string>& deepspeed_env_files) {
  std::map<std::string, std::string> vars;  // sorted: a stable command line
  for (char** e = env; e != nullptr && *e != nullptr; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string key = kv.substr(0, eq);
    for (const char* p : {"NCCL", "PYTHON", "UCX", "MV2", "FTRUN_"}) {
      if (StartsWith(key, p)) vars[key] = kv.substr(eq + 1);
    }
  }
  for (const auto& path : deepspeed_env_files) {
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
      size_t eq = line.find('=');
      if (line.empty() || line[0] == '#' || eq == std::string::npos || eq == 0) continue;
      vars[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  std::vector<std::string> out;
  for (const auto& [k, v] : vars) out.push_back(k + "=" + v);
  return out;
}

Status ShellSplit(const std::string& s, std::vector<std::string>* out) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;  // a word has started (possibly empty, from '' or "")
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
    } else if (c == '\\') {
      if (i + 1 >= s.size()) {
        return Status::InvalidArgument("expected a character after the backslash at the end of " + Quote(s));
      }
      char next = s[++i];
      if (next == '\n') continue;  // line continuation
      word.push_back(next);
      in_word = true;
    } else if (c == '\'') {
      size_t end = s.find('\'', i + 1);
      if (end == std::string::npos) {
        return Status::InvalidArgument("unterminated single quote at offset " + std::to_string(i) + " in " + Quote(s) +
                                       "; expected a closing '");
      }
      word.append(s, i + 1, end - i - 1);
      in_word = true;
      i = end;
    } else if (c == '"') {
      size_t start = i;
      bool closed = false;
      for (++i; i < s.size(); ++i) {
        char d = s[i];
        if (d == '"') {
          closed = true;
          break;
        }
        if (d == '\\' && i + 1 < s.size() &&
            (s[i + 1] == '$' || s[i + 1] == '`' || s[i + 1] == '"' || s[i + 1] == '\\' || s[i + 1] == '\n')) {
          if (s[++i] != '\n') word.push_back(s[i]);
          continue;
        }
        word.push_back(d);
      }
      if (!closed) {
        return Status::InvalidArgument("unterminated double quote at offset " + std::to_string(start) + " in " +
                                       Quote(s) + "; expected a closing \"");
      }
      in_word = true;
    } else {
      word.push_back(c);
      in_word = true;
    }
  }
  if (in_word) words.push_back(std::move(word));
  *out = std::move(words);
  return Status::Ok();
}

std::string ExpandNodeTemplate(const std::string& tmpl, int node_index) {
  static const std::string kKey = "{node}";
  const std::string value = std::to_string(node_index);
  std::string out;
  size_t start = 0;
  for (;;) {
    size_t pos = tmpl.find(kKey, start);
    if (pos == std::string::npos) break;
    out.append(tmpl, start, pos - start);
    out += value;
    start = pos + kKey.size();
  }
  out.append(tmpl, start, std::string::npos);
  return out;
}

}  // namespace ftrun
