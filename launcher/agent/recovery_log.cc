#include "launcher/agent/recovery_log.h"

#include "plugin/common/duration.h"
#include "plugin/common/log.h"

namespace ftrun {

void RecoveryLog::Failed(int restart, const std::string& reason) {
  Record r;
  r.restart = restart;
  r.reason = reason;
  r.detected = clock_.Now();
  records_.push_back(r);
}

void RecoveryLog::Stopped() {
  if (!records_.empty()) records_.back().stopped = clock_.Now();
}

void RecoveryLog::Starting(int restart, std::optional<uint64_t> version, const std::string& takeover,
                           int max_restarts) {
  if (pending()) {
    Record& r = records_.back();
    r.restart = restart;
    r.version = version;
    FTRUN_LOG_WARN("restart {} of {}: {}; restoring {}", restart, max_restarts, r.reason,
                   version ? "version " + std::to_string(*version) : std::string("nothing (no committed version)"));
  } else if (restart > 0 && !takeover.empty()) {
    Record r;
    r.restart = restart;
    r.reason = takeover;
    r.version = version;
    r.detected = r.stopped = clock_.Now();
    records_.push_back(r);
  }
}

void RecoveryLog::Spawned(int generation, Time at, Started how) {
  if (records_.empty() || records_.back().restart != generation) return;
  Record& r = records_.back();
  r.spawned = at;
  r.survivors = how.survivors;
  r.standbys = how.standbys;
  r.cold = how.cold;
}

const char* RecoveryLog::Record::kind() const {
  if (survivors + standbys == 0) return cold == 0 ? "none" : "cold";
  return cold == 0 ? "warm" : "mixed";
}

void RecoveryLog::Abandoned() {
  if (pending()) records_.pop_back();
}

void RecoveryLog::AllRanks(int generation, Phase phase, Time latest) {
  if (records_.empty() || records_.back().restart != generation) return;
  Record& r = records_.back();
  if (phase == Phase::kConnected) {
    r.connected = latest;
  } else if (phase == Phase::kRestored) {
    r.restored = latest;
  } else {
    r.first_step = latest;
    FTRUN_LOG_INFO(
        "recovered from '{}' in {:.0f} ms ({}: {} resumed, {} from standbys, {} started): stop {:.0f}, respawn {:.0f}, "
        "connect {:.0f}, restore {:.0f}, "
        "first step {:.0f} (version {})",
        r.reason, Ms(latest - r.detected), r.kind(), r.survivors, r.standbys, r.cold, Ms(r.stopped - r.detected),
        Ms(r.spawned - r.stopped), Ms(r.connected.value_or(r.spawned) - r.spawned),
        Ms(r.restored.value_or(r.connected.value_or(r.spawned)) - r.connected.value_or(r.spawned)),
        Ms(latest - r.restored.value_or(r.connected.value_or(r.spawned))),
        r.version ? std::to_string(*r.version) : std::string("none: fresh start"));
  }
}

nlohmann::json RecoveryLog::ToJson() const {
  using nlohmann::json;
  json out = json::array();
  for (const Record& r : records_) {
    json x = {{"restart", r.restart}, {"reason", r.reason}};
    if (r.spawned != Time{}) {
      x["kind"] = r.kind();
      x["survivors"] = r.survivors;
      x["standbys"] = r.standbys;
      x["cold"] = r.cold;
    }
    x["version"] = r.version ? json(*r.version) : json(nullptr);
    if (r.first_step) {
      auto connected = r.connected.value_or(r.spawned);
      auto restored = r.restored.value_or(connected);
      x["stop_ms"] = Ms(r.stopped - r.detected);
      x["respawn_ms"] = Ms(r.spawned - r.stopped);
      x["connect_ms"] = Ms(connected - r.spawned);
      x["restore_ms"] = Ms(restored - connected);
      x["first_step_ms"] = Ms(*r.first_step - restored);
      x["total_ms"] = Ms(*r.first_step - r.detected);
      // Raw CLOCK_MONOTONIC stamps, comparable with other processes' clocks.
      x["detected_mono_ns"] =
          std::chrono::duration_cast<std::chrono::nanoseconds>(r.detected.time_since_epoch()).count();
      x["first_step_mono_ns"] =
          std::chrono::duration_cast<std::chrono::nanoseconds>(r.first_step->time_since_epoch()).count();
    }
    out.push_back(x);
  }
  return out;
}

}  // namespace ftrun
