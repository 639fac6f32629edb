#include "launcher/agent/node_store.h"

#include "plugin/common/duration.h"
#include "plugin/common/log.h"
#include "plugin/config/units.h"

namespace ftrun {

NodeStore::~NodeStore() {
  stop_prefault_ = true;
  if (prefault_.joinable()) prefault_.join();
}

Status NodeStore::Open(const std::string& job_id, uint32_t agent_id, const StoreConfig& store) {
  FTRUN_RETURN_IF_ERROR(Arena::Create(job_id, agent_id, store.memory_budget, store.chunk_size, &arena_));
  if (store.prefault) {
    // On a thread: ranks start meanwhile; it is joined before the arena goes.
    prefault_ = std::thread([this] {
      auto t0 = clock_.Now();
      if (!arena_.Prefault(&stop_prefault_)) return;
      prefaulted_ = true;
      FTRUN_LOG_INFO("store of {} pre-faulted in {:.0f} ms", FormatSize(arena_.size()), Ms(clock_.Now() - t0));
    });
  }
  catalog_ = std::make_unique<SnapshotStore>(arena_.data_offset(), arena_.data_bytes(),
                                             FormatLoc(store.memory_budget_loc, "store.memory_budget"));
  retention_ = std::make_unique<VersionRetention>(catalog_.get(), &tracker_);
  service_ = std::make_unique<StoreService>(catalog_.get(), &tracker_, retention_.get(), store.chunk_size, clock_);
  return Status::Ok();
}

}  // namespace ftrun
