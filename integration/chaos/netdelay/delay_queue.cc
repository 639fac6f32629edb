#include "integration/chaos/netdelay/delay_queue.h"

// The libc network headers before the kernel's (linux/in.h, pulled in by
// linux/netfilter.h, yields to netinet/in.h only in this order).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>
// The kernel's nfnetlink headers before libnetfilter_queue's (its own copy
// of them would win otherwise and lacks the nf_tables subsystem).
// clang-format off
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
// clang-format on

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ftrun::netdelay {
namespace {

constexpr int kRcvBufBytes = 64 << 20;         // netlink receive buffer (the kernel doubles it)
constexpr size_t kVerdictBufBytes = 64 << 10;  // verdict messages sent per sendto()
constexpr int kRecvBurst = 1024;               // messages read before releases are checked again

// "netlink portid P" when another socket in this namespace has `queue`
// bound (from /proc/net/netfilter/nfnetlink_queue: queue portid ...), else "".
std::string QueueOwner(int queue) {
  std::string owner;
  if (FILE* f = std::fopen("/proc/net/netfilter/nfnetlink_queue", "re")) {
    unsigned num = 0, portid = 0;
    char line[256];
    while (std::fgets(line, sizeof(line), f)) {
      if (std::sscanf(line, "%u %u", &num, &portid) == 2 && static_cast<int>(num) == queue) {
        owner = "another program (netlink portid " + std::to_string(portid) + ")";
      }
    }
    std::fclose(f);
  }
  return owner;
}

}  // namespace

DelayQueue::DelayQueue(const Options& o, MnlSocket nl)
    : o_(o),
      nl_(std::move(nl)),
      fd_(mnl_socket_get_fd(nl_.get())),
      rng_(o.seed ? *o.seed : std::random_device{}()),
      loss_(0.0, 100.0),
      jitter_(-o.jitter_ms * 1e6, o.jitter_ms * 1e6),
      recv_buf_(MNL_SOCKET_BUFFER_SIZE * 2),
      verdicts_(kVerdictBufBytes) {}

void DelayQueue::Configure() {
  // SO_RCVBUFFORCE (root) ignores net.core.rmem_max: the socket must hold a
  // message for every packet the kernel queues (kQueueMaxLen) or messages
  // are lost (ENOBUFS; with fail-open, below, those packets pass undelayed).
  int size = kRcvBufBytes;
  if (setsockopt(fd_, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof(size)) < 0 &&
      setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size)) < 0) {
    Fatal("setsockopt(SO_RCVBUF)", errno);
  }
  if (fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK) < 0) Fatal("fcntl(O_NONBLOCK)", errno);

  char buf[MNL_SOCKET_BUFFER_SIZE];
  nlmsghdr* nlh = nfq_nlmsg_put(buf, NFQNL_MSG_CONFIG, o_.queue);
  nfq_nlmsg_cfg_put_cmd(nlh, AF_UNSPEC, NFQNL_CFG_CMD_BIND);
  if (int err = Request(nlh, "bind")) {
    // The kernel answers EPERM both without CAP_NET_ADMIN and when another
    // socket has the queue; /proc tells which.
    std::string owner = QueueOwner(o_.queue);
    Fatal("netlink bind queue " + std::to_string(o_.queue) + " (NFQNL_CFG_CMD_BIND" +
              (!owner.empty() ? "; " + owner + " has this queue bound)"
               : err == EPERM ? "; needs CAP_NET_ADMIN in this namespace)"
                              : ")"),
          err);
  }

  nlh = nfq_nlmsg_put(buf, NFQNL_MSG_CONFIG, o_.queue);
  nfq_nlmsg_cfg_put_params(nlh, NFQNL_COPY_META, 0);
  nfq_nlmsg_cfg_put_qmaxlen(nlh, kQueueMaxLen);
  // FAIL_OPEN: when the queue is full (kQueueMaxLen held) or our socket is,
  // the kernel accepts the packet instead of dropping it: an overloaded
  // delay degrades to less delay, never to loss we did not ask for.
  // GSO: GSO packets are queued whole, not segmented first (we copy no payload).
  uint32_t flags = NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO;
  mnl_attr_put_u32(nlh, NFQA_CFG_FLAGS, htonl(flags));
  mnl_attr_put_u32(nlh, NFQA_CFG_MASK, htonl(flags));
  if (int err = Request(nlh, "configure")) {
    Fatal("netlink configure queue " + std::to_string(o_.queue) + " (copy meta, maxlen, flags fail-open|gso)", err);
  }
}

void DelayQueue::Run(int sigfd) {
  while (true) {
    timespec ts{}, *tsp = nullptr;
    if (!held_.empty()) {
      int64_t wait = std::max<int64_t>(0, held_.top().release_ns - NowNs());
      ts.tv_sec = wait / 1000000000;
      ts.tv_nsec = wait % 1000000000;
      tsp = &ts;
    }
    pollfd p[2] = {{fd_, POLLIN, 0}, {sigfd, POLLIN, 0}};
    int r = ppoll(p, 2, tsp, nullptr);
    if (r < 0 && errno != EINTR) Fatal("ppoll", errno);
    if (r > 0 && (p[1].revents & POLLIN)) {
      signalfd_siginfo si;
      if (read(sigfd, &si, sizeof(si)) == sizeof(si)) {
        std::fprintf(stderr, "%s: %s, stopping\n", kProg, strsignal(static_cast<int>(si.ssi_signo)));
      }
      return;
    }
    if (r > 0 && (p[0].revents & (POLLIN | POLLERR))) ReadMessages(kRecvBurst);
    ReleaseDue(NowNs());
    FlushVerdicts();
  }
}

void DelayQueue::ReleaseAll() {
  ReadMessages(kQueueMaxLen);
  ReleaseDue(INT64_MAX);
  FlushVerdicts();
  stopping_ = true;
  char buf[MNL_SOCKET_BUFFER_SIZE];
  nlmsghdr* nlh = nfq_nlmsg_put(buf, NFQNL_MSG_VERDICT_BATCH, o_.queue);
  nfq_nlmsg_verdict_put(nlh, static_cast<int>(last_id_ + (1u << 30)), NF_ACCEPT);
  int err = Request(nlh, "batch verdict");
  if (err != 0 && err != ENOENT) {  // ENOENT: nothing was left
    Fatal("netlink batch verdict (accept all, queue " + std::to_string(o_.queue) + ")", err);
  }
  ReadMessages(kQueueMaxLen);
  FlushVerdicts();
}

void DelayQueue::Unbind() {
  char buf[MNL_SOCKET_BUFFER_SIZE];
  nlmsghdr* nlh = nfq_nlmsg_put(buf, NFQNL_MSG_CONFIG, o_.queue);
  nfq_nlmsg_cfg_put_cmd(nlh, AF_UNSPEC, NFQNL_CFG_CMD_UNBIND);
  if (int err = Request(nlh, "unbind")) Fatal("netlink unbind queue " + std::to_string(o_.queue), err);
}

int DelayQueue::Request(nlmsghdr* nlh, const std::string& what) {
  nlh->nlmsg_flags |= NLM_F_ACK;
  nlh->nlmsg_seq = ++seq_;
  if (mnl_socket_sendto(nl_.get(), nlh, nlh->nlmsg_len) < 0) Fatal("sendto (" + what + ")", errno);
  awaiting_ = nlh->nlmsg_seq;
  ack_error_.reset();
  int64_t deadline = NowNs() + 5 * int64_t{1000000000};
  while (!ack_error_) {
    int64_t left = deadline - NowNs();
    if (left <= 0) Fatal("waiting for the kernel's answer (" + what + ")", ETIMEDOUT);
    pollfd p{fd_, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left / 1000000) + 1);
    if (r < 0 && errno != EINTR) Fatal("poll (" + what + ")", errno);
    if (r > 0) ReadMessages(kRecvBurst);
  }
  awaiting_ = 0;
  return *ack_error_;
}

void DelayQueue::ReadMessages(int limit) {
  for (int i = 0; i < limit; ++i) {
    ssize_t n = mnl_socket_recvfrom(nl_.get(), recv_buf_.data(), recv_buf_.size());
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      if (errno == ENOBUFS) {  // messages were lost; fail-open let their packets through
        ++c_.overruns;
        continue;
      }
      Fatal("recvmsg (NFQUEUE socket)", errno);
    }
    int64_t now = NowNs();
    int len = static_cast<int>(n);
    for (auto* m = reinterpret_cast<nlmsghdr*>(recv_buf_.data()); mnl_nlmsg_ok(m, len); m = mnl_nlmsg_next(m, &len)) {
      if (m->nlmsg_type == NLMSG_ERROR) {
        int err = -static_cast<const nlmsgerr*>(mnl_nlmsg_get_payload(m))->error;
        if (awaiting_ && m->nlmsg_seq == awaiting_) {
          ack_error_ = err;
        } else if (err && !(stopping_ && err == ENOENT)) {
          if (c_.verdict_errors++ == 0) first_verdict_error_ = err;
        }
      } else if (NFNL_MSG_TYPE(m->nlmsg_type) == NFQNL_MSG_PACKET) {
        HandlePacket(m, now);
      }
    }
  }
}

void DelayQueue::HandlePacket(const nlmsghdr* nlh, int64_t now) {
  nlattr* attr[NFQA_MAX + 1] = {};
  if (nfq_nlmsg_parse(nlh, attr) < 0 || !attr[NFQA_PACKET_HDR]) return;
  auto* ph = static_cast<const nfqnl_msg_packet_hdr*>(mnl_attr_get_payload(attr[NFQA_PACKET_HDR]));
  uint32_t id = ntohl(ph->packet_id);
  last_id_ = id;
  ++c_.seen;
  if (stopping_) {  // ReleaseAll(): no more holding
    ++c_.delayed;
    PutVerdict(id, NF_ACCEPT);
    return;
  }
  if (o_.loss_percent >= 100 || (o_.loss_percent > 0 && loss_(rng_) < o_.loss_percent)) {
    ++c_.dropped;
    PutVerdict(id, NF_DROP);
    return;
  }
  double delay_ns = o_.delay_ms * 1e6 + (o_.jitter_ms > 0 ? jitter_(rng_) : 0.0);
  held_.push(Held{now + static_cast<int64_t>(std::max(0.0, delay_ns)), ++arrivals_, id});
  c_.max_held = std::max<uint64_t>(c_.max_held, held_.size());
}

void DelayQueue::ReleaseDue(int64_t now) {
  while (!held_.empty() && held_.top().release_ns <= now) {
    PutVerdict(held_.top().id, NF_ACCEPT);
    ++c_.delayed;
    held_.pop();
  }
}

void DelayQueue::PutVerdict(uint32_t id, int verdict) {
  if (verdict_len_ + 128 > verdicts_.size()) FlushVerdicts();
  nlmsghdr* nlh = nfq_nlmsg_put(verdicts_.data() + verdict_len_, NFQNL_MSG_VERDICT, o_.queue);
  nfq_nlmsg_verdict_put(nlh, static_cast<int>(id), verdict);
  verdict_len_ += NLMSG_ALIGN(nlh->nlmsg_len);
}

void DelayQueue::FlushVerdicts() {
  if (verdict_len_ == 0) return;
  if (mnl_socket_sendto(nl_.get(), verdicts_.data(), verdict_len_) < 0) Fatal("sendto (verdicts)", errno);
  verdict_len_ = 0;
}

}  // namespace ftrun::netdelay
