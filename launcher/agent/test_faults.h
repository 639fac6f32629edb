// Tests only: a seam that lets an integration test make a real agent's
// restores from the persist directory see read errors, where the machine
// offers no kernel mechanism for it (no device-mapper in the test sandbox,
// and no root on CI runners).
//
// FTRUN_TEST_DISK_READ_FAULTS="<errno>:<count>[:<path part>]" makes
// RestoreReadEnv() a FaultEnv (plugin/persist/fault_env.h) over the POSIX
// Env whose first <count> reads of files whose path contains <path part>
// fail with <errno> (5 = EIO). Unset (always, outside tests): the POSIX Env.
// The agent logs a warning naming the variable when it is set.
#pragma once

#include "plugin/persist/env.h"

namespace ftrun {

// The Env that restores read the persist directory through. Never deleted.
Env* RestoreReadEnv();

}  // namespace ftrun
