#include "launcher/runner/leadership.h"

#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "plugin/common/log.h"

namespace ftrun {

namespace {

int64_t Ns(Leadership::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::string Describe(const LeaderRecord& r) {
  return "pid " + std::to_string(r.pid) + " on " + (r.host.empty() ? "?" : r.host) +
         (r.address.empty() ? " (starting)" : " at " + r.address) + ", term " + std::to_string(r.term);
}

// Renewals must land well inside the lease: a margin of a fifth of it
// (at least 300 ms) covers a slow answer and clock rates.
std::chrono::milliseconds Margin(std::chrono::milliseconds ttl) {
  return std::max(std::chrono::milliseconds(300), ttl / 5);
}

}  // namespace

Leadership::Leadership(const CoordinatorConfig& config, const std::string& job)
    : config_(config), keys_(KeysOf(config, job)), client_(EtcdOptionsOf(config)), ttl_(config.etcd_lease_ttl) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  self_.pid = ::getpid();
  self_.host = host;
}

Leadership::~Leadership() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status Leadership::Campaign(bool wait, const std::function<bool()>& stop, Outcome* outcome, std::string* end) {
  const int ttl_s = static_cast<int>(ttl_.count() / 1000);
  std::string said;  // the last thing logged while waiting
  while (true) {
    if (stop && stop()) return *outcome = Outcome::kStopped, Status::Ok();
    std::optional<EtcdValue> ended;
    Status s = wait ? client_.Get(keys_.end, &ended) : Status::Ok();
    if (s.ok() && ended) return *end = ended->value, *outcome = Outcome::kEnded, Status::Ok();
    if (s.ok() && lease_ != 0) {  // the lease of an earlier try, while it lasts
      int64_t left = 0;
      if (!client_.KeepAlive(lease_, &left).ok() || left <= 0) lease_ = 0;
    }
    if (s.ok() && lease_ == 0) s = client_.Grant(ttl_s, &lease_);
    const Clock::time_point sent = Clock::now();
    bool created = false;
    EtcdValue holder;
    if (s.ok()) s = client_.CreateIfAbsent(keys_.leader, EncodeLeader(self_), lease_, &created, &holder);
    if (s.ok() && created && wait && client_.Get(keys_.end, &ended).ok() && ended) {
      // The leader ended the job, then let its lease go, between our two calls: nothing to lead.
      (void)client_.Revoke(lease_);
      return *end = ended->value, *outcome = Outcome::kEnded, Status::Ok();
    }
    if (s.ok() && created) {
      term_ = holder.create_revision;
      valid_until_ns_ = Ns(sent + ttl_ - Margin(ttl_));
      bool gone = false;  // a fresh run under a job id used before: its end is not this run's
      if (!wait && !client_.DeleteIfTerm(keys_.leader, term_, keys_.end, &gone).ok())
        FTRUN_LOG_WARN("coordinator: cannot clear an earlier run's end key {} in etcd", keys_.end);
      FTRUN_LOG_INFO("coordinator: leading the job (etcd key {} at {}, term {}, lease {} s)", keys_.leader,
                     client_.endpoint(), term_, ttl_s);
      return *outcome = Outcome::kLeading, Status::Ok();
    }
    std::string now;
    if (s.ok()) {
      LeaderRecord r;
      Status d = DecodeLeader(keys_.leader, holder, &r);
      now = "the job's coordinator is " + (d.ok() ? Describe(r) : d.message());
      if (!wait) {
        return Status::FailedPrecondition(now + " (etcd key " + keys_.leader +
                                          "): a job id runs under one coordinator; start a standby with "
                                          "`ftrun --standby-coordinator JOB` instead");
      }
    } else {
      if (!wait) return s;
      now = "etcd: " + s.message();
    }
    if (now != said) FTRUN_LOG_INFO("standby coordinator: {}; waiting", now);
    said = now;
    for (auto until = Clock::now() + ttl_ / 3; Clock::now() < until;) {
      if (stop && stop()) return *outcome = Outcome::kStopped, Status::Ok();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

void Leadership::Announce(const std::string& address) {
  self_.address = address;
  {
    std::lock_guard<std::mutex> l(mu_);
    leader_value_ = EncodeLeader(self_);
  }
  cv_.notify_all();
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
}

void Leadership::Publish(std::string state, bool urgent) {
  {
    std::lock_guard<std::mutex> l(mu_);
    state_ = std::move(state);
    state_urgent_ = state_urgent_ || urgent;
  }
  cv_.notify_all();
}

Status Leadership::ReadState(std::string* state) {
  std::optional<EtcdValue> v;
  FTRUN_RETURN_IF_ERROR(client_.Get(keys_.state, &v));
  if (!v) return Status::NotFound("etcd key " + keys_.state + " does not exist: the job's last leader never wrote it");
  *state = v->value;
  return Status::Ok();
}

bool Leadership::Leading(Clock::time_point now) const { return Ns(now) < valid_until_ns_.load(); }

std::string Leadership::LostWhy() const {
  std::lock_guard<std::mutex> l(mu_);
  return lost_why_.empty() ? "no renewal of the lease answered for " + std::to_string(ttl_.count()) + " ms" : lost_why_;
}

bool Leadership::Renew() {
  const Clock::time_point sent = Clock::now();
  int64_t left = 0;
  Status s = client_.KeepAlive(lease_, &left);
  // The leader key itself, checked with every renewal (not only at the
  // next write, which an idle job may not make for long): deleted or
  // created again by anyone, this process no longer leads.
  std::optional<EtcdValue> key;
  const bool key_read = s.ok() && client_.Get(keys_.leader, &key).ok();
  std::lock_guard<std::mutex> l(mu_);
  if (!s.ok()) {
    lost_why_ = "cannot renew the lease: " + s.message();
    return false;
  }
  if (left <= 0) {
    valid_until_ns_ = 0;
    lost_why_ = "the lease lapsed on etcd's side";
    return false;
  }
  if (key_read && (!key || key->create_revision != term_)) {
    valid_until_ns_ = 0;
    lost_why_ = "etcd key " + keys_.leader +
                (key ? " was created again (term " + std::to_string(key->create_revision) + ")" : " was deleted") +
                ", not by this coordinator (term " + std::to_string(term_) + ")";
    return false;
  }
  const auto granted = std::min(ttl_, std::chrono::milliseconds(left * 1000));
  valid_until_ns_ = Ns(sent + granted - Margin(ttl_));
  return true;
}

void Leadership::Run() {
  const auto period = ttl_ / 3;
  auto next_renew = Clock::now() + period;
  while (true) {
    std::optional<std::string> leader, state;
    {
      std::unique_lock<std::mutex> l(mu_);
      auto deadline = next_renew;
      if (state_) deadline = std::min(deadline, state_due_);
      auto due = [&] { return state_ && (state_urgent_ || Clock::now() >= state_due_); };
      cv_.wait_until(l, deadline, [&] { return stop_ || leader_value_ || due(); });
      if (stop_) return;
      leader.swap(leader_value_);
      if (due()) {
        state.swap(state_);
        state_urgent_ = false;
      }
    }
    if (Clock::now() >= next_renew) {
      const bool renewed = Renew();
      next_renew = Clock::now() + (renewed ? period : period / 4);  // (an etcd election passes: try again soon)
    }
    for (auto* w : {&leader, &state}) {
      if (!*w) continue;
      const bool is_leader = w == &leader;
      bool put = false;
      Status s = client_.PutIfTerm(keys_.leader, term_, is_leader ? keys_.leader : keys_.state, **w,
                                   is_leader ? lease_ : 0, &put);
      std::lock_guard<std::mutex> l(mu_);
      if (s.ok() && !put) {
        valid_until_ns_ = 0;
        lost_why_ = "another coordinator leads the job (etcd key " + keys_.leader + " is no longer term " +
                    std::to_string(term_) + ")";
      } else if (!s.ok() && !(is_leader ? leader_value_ : state_)) {  // again on the next turn
        (is_leader ? leader_value_ : state_) = std::move(*w);
      }
      if (!is_leader) state_due_ = Clock::now() + std::chrono::seconds(1);
    }
  }
}

void Leadership::End(int exit_code, const std::string& message) {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  bool put = false;
  const std::string end = nlohmann::json{{"exit_code", exit_code}, {"message", message.substr(0, 2000)}}.dump();
  Status s = client_.PutIfTerm(keys_.leader, term_, keys_.end, end, 0, &put);
  if (!s.ok() || !put)
    FTRUN_LOG_WARN("coordinator: cannot record the job's end in etcd ({}): standby coordinators wait on",
                   s.ok() ? "this process no longer leads" : s.message());
  if (lease_ != 0 && !client_.Revoke(lease_).ok()) FTRUN_LOG_WARN("coordinator: cannot revoke the etcd lease");
}

}  // namespace ftrun
