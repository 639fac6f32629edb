// The delay itself: ftrun-netdelay's NFQUEUE queue. Every packet the rules
// send to the queue gets its verdict here: NF_DROP with probability
// --loss-percent, else NF_ACCEPT once it has been held for --delay-ms (plus
// the jitter). One thread: a min-heap of release times (FIFO among equal
// times), ppoll() on the netlink socket with the time to the earliest
// release as timeout. Only metadata is copied (NFQNL_COPY_META) and GSO
// packets are queued whole (NFQA_CFG_F_GSO).
#pragma once

#include <libmnl/libmnl.h>
#include <time.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "integration/chaos/netdelay/netlink.h"
#include "integration/chaos/netdelay/options.h"

namespace ftrun::netdelay {

constexpr uint32_t kQueueMaxLen = 16384;  // packets the kernel holds for us at most

struct Held {
  int64_t release_ns;
  uint64_t seq;  // arrival order: FIFO among equal release times
  uint32_t id;
  bool operator>(const Held& o) const { return release_ns != o.release_ns ? release_ns > o.release_ns : seq > o.seq; }
};

struct Counters {
  uint64_t seen = 0, dropped = 0, delayed = 0, max_held = 0;
  uint64_t overruns = 0;        // ENOBUFS: the socket was full; with fail-open those packets passed undelayed
  uint64_t verdict_errors = 0;  // the kernel refused a verdict (e.g. the packet was gone)
};

class DelayQueue {
 public:
  DelayQueue(const Options& o, MnlSocket nl);

  void Configure();

  // Runs until a signal arrives on sigfd.
  void Run(int sigfd);

  // Accepts every held packet (in release order) and whatever is still
  // unread in the socket, then every packet the kernel queued since: one
  // batch verdict (all ids up to the given one), and a verdict of its own
  // for each packet read after that (ENOENT, ignored, if the batch had it).
  void ReleaseAll();

  // Unbinding drops whatever is still queued: call ReleaseAll() first.
  void Unbind();

  const Counters& counters() const { return c_; }
  int first_verdict_error() const { return first_verdict_error_; }

 private:
  // Sends one message with NLM_F_ACK and waits for its answer (0 or an
  // errno); packet messages read meanwhile are handled as usual.
  int Request(nlmsghdr* nlh, const std::string& what);

  // Reads up to `limit` messages without blocking.
  void ReadMessages(int limit);

  void HandlePacket(const nlmsghdr* nlh, int64_t now);

  void ReleaseDue(int64_t now);

  void PutVerdict(uint32_t id, int verdict);

  // One sendto() for all verdicts given since the last flush.
  void FlushVerdicts();

  const Options& o_;
  MnlSocket nl_;
  int fd_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> loss_;
  std::uniform_real_distribution<double> jitter_;
  std::priority_queue<Held, std::vector<Held>, std::greater<Held>> held_;
  uint64_t arrivals_ = 0;
  std::vector<char> recv_buf_;
  std::vector<char> verdicts_;
  size_t verdict_len_ = 0;
  uint32_t seq_ = static_cast<uint32_t>(time(nullptr));
  uint32_t awaiting_ = 0;
  uint32_t last_id_ = 0;
  bool stopping_ = false;
  std::optional<int> ack_error_;
  Counters c_;
  int first_verdict_error_ = 0;
};

}  // namespace ftrun::netdelay
