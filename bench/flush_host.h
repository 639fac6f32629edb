// What the flush scenario (bench/flush_bench.cc) needs of this machine:
// programs on PATH, reading a log and removing its scratch trees, waiting
// for a child with a time limit, and the CPU time of the machine and of
// this process's children (a run is only fair when others are quiet).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

namespace ftrun::bench::flush {

// The path of `name` on $PATH, "" when it is not there.
std::string FindInPath(const std::string& name);

// The whole file, "" when it cannot be read.
std::string ReadAll(const std::string& path);

// rm -rf path, only for a path of ours (it contains "ftrun-bench").
void RemoveTree(const std::string& path);

// Waits for pid up to `limit`; SIGKILLs it after that. Returns the exit code.
int WaitExitFor(pid_t pid, std::chrono::seconds limit);

// CPU seconds of the whole machine so far (user, nice, system, irq, softirq, steal).
double MachineCpuSeconds();

// CPU seconds of this process's reaped children (the agent, and the ranks it reaped).
double ChildrenCpuSeconds();

// Waits (up to `limit`) for a second in which the machine's CPU time stays
// under `cores`: nothing of ours runs at this point, so it is others'.
void WaitForQuiet(double cores, std::chrono::seconds limit);

}  // namespace ftrun::bench::flush
