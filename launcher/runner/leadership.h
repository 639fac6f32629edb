// Leadership: a coordinator's hold on its job through an etcd lease
// (coordinator.etcd_endpoints; keys in plugin/etcd/leader_record.h).
//
// Campaign creates PREFIX/JOB/leader under a fresh lease, or waits while
// another process holds it; the winner's term is the key's create_revision,
// which only grows. Then a thread renews the lease every ttl/3 and writes
// what Announce and Publish hand it, each write fenced on the term (a txn
// that fails once another process leads). Leading(now) is the main loop's
// check before it acts: it turns false a margin before the lease could
// lapse on etcd's side, counted from the send time of the last renewal
// etcd answered; a leader cut off from etcd stops before a successor can
// begin, so no two coordinators ever send orders in the same term's time.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ftrun/status.h"
#include "plugin/config/config.h"
#include "plugin/etcd/etcd_client.h"
#include "plugin/etcd/leader_record.h"

namespace ftrun {

class Leadership {
 public:
  using Clock = std::chrono::steady_clock;

  Leadership(const CoordinatorConfig& config, const std::string& job);
  ~Leadership();  // stops the thread; the lease is left to lapse (End revokes it)

  enum class Outcome { kLeading, kEnded, kStopped };
  // wait false: fails naming the holder when another process leads.
  // wait true: retries every ttl/3 until this process leads, the job's end
  // key appears (*end holds it), or stop() says so.
  Status Campaign(bool wait, const std::function<bool()>& stop, Outcome* outcome, std::string* end);
  // After kLeading: the coordinator's address for the agents (a rewrite of
  // the leader key, fenced); starts the renewing thread.
  void Announce(const std::string& address);
  // What a successor needs (latest wins): written within a second, or at
  // once when `urgent` (the agents or their nodes changed).
  void Publish(std::string state, bool urgent);
  // The last state any leader published (a successor reads it after its
  // Campaign).
  Status ReadState(std::string* state);

  bool Leading(Clock::time_point now) const;
  // Why Leading turned false, for the log.
  std::string LostWhy() const;
  int64_t term() const { return term_; }
  const JobKeys& keys() const { return keys_; }

  // The job ended: its end key (fenced), then the lease revoked.
  void End(int exit_code, const std::string& message);

 private:
  void Run();
  bool Renew();  // false: not renewed (retried sooner)

  CoordinatorConfig config_;
  JobKeys keys_;
  EtcdClient client_;  // Campaign's, then the thread's only
  int64_t lease_ = 0;
  int64_t term_ = 0;
  LeaderRecord self_;
  std::chrono::milliseconds ttl_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::optional<std::string> leader_value_, state_;  // to write
  Clock::time_point state_due_{};                    // not before, unless urgent
  bool state_urgent_ = false;
  std::string lost_why_;
  std::atomic<int64_t> valid_until_ns_{0};  // steady clock
  std::thread thread_;
};

}  // namespace ftrun
