// `ftrun status`: prints a job's health from the status files its runner
// and agents keep in the job's directory (run_dir/<job id>/status.json and
// agentN.json): nodes and spares, the committed version and how many live
// copies each rank has of it, memory used per node, restarts and their
// durations. It reads files only, so it works from any shell on the launch
// host while the job runs, and after it ended.
#pragma once

namespace ftrun {

// argv[0] is "status". Exit codes: 0 the job is running or finished well,
// 1 it failed or its runner is gone, 2 bad arguments or no job found.
int RunStatusCommand(int argc, char** argv);

}  // namespace ftrun
