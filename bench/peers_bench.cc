// Scenario "peers": ftrun side by side with what a user could install
// instead, on one DDP job (a GPT, 2 nodes x 2 ranks, gloo), in one run:
// the job's own torch.save checkpoint, PyTorch DCP (save, async_save with a
// thread, with a process), torchft, and ftrun. bench/stack_recovery.py runs
// them all (`--stacks ddp`; every flag after the scenario goes to it, so
// `ftrun-bench peers --help` lists them) and writes the JSON and, with
// --chart, the PNG of docs/benchmarks.md.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "launcher/common/install_paths.h"

namespace ftrun::bench {

int RunPeers(int argc, char** argv) {
  std::string python = PythonInterpreter();  // the agent's rule: FTRUN_PYTHON, else python3
  std::string driver = BenchScript("stack_recovery.py", __FILE__);
  if (!PathExists(driver)) {
    std::fprintf(stderr, "ftrun-bench peers: no driver at %s\n", driver.c_str());
    return 2;
  }
  // 6 layers: 277 MiB of model and AdamW state per rank (the issue's >= 256 MiB); flags after these win
  std::vector<std::string> args = {python,     driver, "--build",  DirOf(SiblingBinary("ftrun-bench")),
                                   "--python", python, "--stacks", "ddp",
                                   "--layers", "6"};
  for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> exec_argv;
  for (auto& a : args) exec_argv.push_back(a.data());
  exec_argv.push_back(nullptr);
  ::execvp(python.c_str(), exec_argv.data());
  std::perror(("ftrun-bench peers: exec " + python).c_str());
  return 127;
}

}  // namespace ftrun::bench
