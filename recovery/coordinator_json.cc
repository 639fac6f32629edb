// The status JSON of a coordinator's view (coordinator_view.h): the fields
// of status.json that `ftrun status`, the chaos harness and the tests read.
#include "recovery/coordinator_json.h"

#include "plugin/common/duration.h"

namespace ftrun {

nlohmann::json StatusJson(const CoordinatorView& v) {
  using nlohmann::json;
  json j;
  j["phase"] = v.phase;
  j["epoch"] = v.epoch;
  j["committed_version"] = v.committed ? json(*v.committed) : json(nullptr);
  j["replicas"] = v.replicas;
  j["restarts"] = v.restarts;
  j["nodes"] = json::array();
  for (const auto& n : v.nodes) {
    json x = {{"node", n.node}, {"ranks", n.ranks}, {"rack", n.rack}};
    x["agent"] = n.agent ? json(*n.agent) : json(nullptr);
    if (n.agent) x["address"] = n.address;
    j["nodes"].push_back(x);
  }
  j["spares"] = json::array();
  for (const auto& s : v.spares) j["spares"].push_back({{"agent", s.agent}, {"address", s.address}});
  if (v.committed) j["committed_copies"] = v.committed_copies;
  if (v.erasure_data > 0) {
    json e = {{"data", v.erasure_data}, {"parity", v.erasure_parity}, {"groups", json::array()}};
    for (const auto& g : v.groups)
      e["groups"].push_back({{"nodes", g.nodes}, {"survives", g.survives ? json(*g.survives) : json(nullptr)}});
    j["erasure"] = e;
  }
  j["commits"] = v.commits;
  j["held_reports"] = v.held_reports;
  j["last_commit_lag_ms"] = v.last_commit_lag_ms ? json(*v.last_commit_lag_ms) : json(nullptr);
  j["recoveries"] = json::array();
  auto ns = [](CoordinatorView::Time t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  for (const auto& r : v.recoveries) {
    json x = {{"epoch", r.epoch}, {"reason", r.reason}};
    x["detect_to_start_ms"] = r.started ? json(Ms(*r.started - r.detected)) : json(nullptr);
    x["detected_mono_ns"] = ns(r.detected);
    if (r.started) x["started_mono_ns"] = ns(*r.started);
    j["recoveries"].push_back(x);
  }
  if (v.done) {
    j["exit_code"] = v.exit_code;
    j["exit_message"] = v.exit_message;
  }
  return j;
}

}  // namespace ftrun
