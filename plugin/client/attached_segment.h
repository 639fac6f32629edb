// A rank's mapping of its agent's store segment, kept for the next client
// of the same process.
//
// Why: under @ftrun.resilient a survivor closes its client when it leaves a
// generation and connects a new one for the next (the agent closes a left
// generation's rank connections). The agent hands the new client the same
// segment. Unmapping it (GiBs, with page-table entries for every page the
// rank touched) cost a survivor 150-230 ms on its way out of a generation,
// and the next generation faulted the pages back in.
//
// How: the segment last attached by this process stays mapped after its
// clients are gone. AttachSegment returns that mapping when the received fd
// is the same file (st_dev and st_ino: the kept mapping holds the file open,
// so its inode cannot go to another file meanwhile) and closes the fd;
// otherwise it maps the new segment (Arena::Attach, every check) and keeps
// that one instead.
#pragma once

#include <memory>
#include <string>

#include "ftrun/status.h"
#include "plugin/common/fd.h"
#include "plugin/store/arena.h"

namespace ftrun {

Status AttachSegment(UniqueFd fd, const std::string& expected_job_id, std::shared_ptr<const Arena>* out);

}  // namespace ftrun
