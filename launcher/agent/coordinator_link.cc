#include "launcher/agent/coordinator_link.h"

#include <utility>

#include "plugin/common/log.h"

namespace ftrun {

CoordinatorLink::CoordinatorLink(Transport* transport, Options options, const Clock& clock)
    : t_(transport), o_(std::move(options)), clock_(clock) {}

void CoordinatorLink::Connect() {
  down_since_ = last_connect_try_ = clock_.Now();
  t_->Connect(o_.peer, o_.address);
}

void CoordinatorLink::PeerUp() {
  up_ = true;
  last_heard_ = clock_.Now();
  if (on_up) on_up();
}

void CoordinatorLink::PeerDown(const std::string& why) {
  if (up_) Lost(why);
}

void CoordinatorLink::Heard() { last_heard_ = clock_.Now(); }

void CoordinatorLink::Retarget(const std::string& address, const std::string& why) {
  if (address == o_.address) return;
  FTRUN_LOG_WARN("the coordinator moved from {} to {} ({})", o_.address, address, why);
  if (up_) {
    Lost("a newer coordinator leads at " + address + " (" + why + ")");
  } else {
    t_->Disconnect(o_.peer);
  }
  o_.address = address;
  last_connect_try_ = Clock::Time{};  // the next tick connects there
}

void CoordinatorLink::Lost(const std::string& why) {
  up_ = false;
  down_since_ = clock_.Now();
  t_->Disconnect(o_.peer);
  if (on_lost) on_lost(why);
}

void CoordinatorLink::Tick(Clock::Time now) {
  const auto interval = o_.heartbeat_interval;
  if (up_) {
    if (now - last_sent_ >= interval) {
      last_sent_ = now;
      if (on_heartbeat) on_heartbeat();
    }
    if (now - last_interval_ >= interval) {
      last_interval_ = now;
      if (on_interval) on_interval();
    }
    if (now - last_heard_ > interval * o_.heartbeat_misses) {
      Lost("no message for " + std::to_string((interval * o_.heartbeat_misses).count()) +
           " ms (cluster.heartbeat_misses x cluster.heartbeat_interval)");
    }
    return;
  }
  if (gave_up_ || now - down_since_ > o_.lost_node_timeout) {
    if (!gave_up_) {
      FTRUN_LOG_ERROR("no coordinator at {} for {} ms (cluster.lost_node_timeout): giving up", o_.address,
                      o_.lost_node_timeout.count());
    }
    gave_up_ = true;
    if (on_give_up) on_give_up();
    return;
  }
  if (now - last_connect_try_ >= interval) {
    last_connect_try_ = now;
    t_->Connect(o_.peer, o_.address);
  }
}

}  // namespace ftrun
