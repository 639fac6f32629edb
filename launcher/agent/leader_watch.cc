#include "launcher/agent/leader_watch.h"

#include "plugin/common/log.h"
#include "plugin/etcd/etcd_client.h"

namespace ftrun {

LeaderWatch::LeaderWatch(const CoordinatorConfig& config, const std::string& job, std::chrono::milliseconds fast,
                         std::chrono::milliseconds slow)
    : keys_(KeysOf(config, job)), fast_(fast), slow_(slow) {
  thread_ = std::thread([this, config] { Run(config); });
}

LeaderWatch::~LeaderWatch() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void LeaderWatch::Connected(bool up) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (up == up_) return;
    up_ = up;
  }
  cv_.notify_all();
}

std::optional<LeaderRecord> LeaderWatch::Newer(int64_t term) const {
  std::lock_guard<std::mutex> l(mu_);
  if (latest_ && latest_->term > term && !latest_->address.empty()) return latest_;
  return std::nullopt;
}

void LeaderWatch::Run(CoordinatorConfig config) {
  EtcdClient client(EtcdOptionsOf(config));
  std::string said;  // the last problem logged
  while (true) {
    std::optional<EtcdValue> v;
    Status s = client.Get(keys_.leader, &v);
    LeaderRecord r;
    if (s.ok() && v) s = DecodeLeader(keys_.leader, *v, &r);
    if (s.ok() && v) {
      std::lock_guard<std::mutex> l(mu_);
      if (!latest_ || r.term >= latest_->term) latest_ = r;  // terms only grow
    }
    if (!s.ok() && s.message() != said)
      FTRUN_LOG_WARN("etcd: cannot read the coordinator's leader key: {}", s.message());
    said = s.ok() ? std::string() : s.message();
    std::unique_lock<std::mutex> l(mu_);
    const bool was_up = up_;
    if (cv_.wait_for(l, up_ ? slow_ : fast_, [&] { return stop_ || up_ != was_up; }) && stop_) return;
  }
}

}  // namespace ftrun
