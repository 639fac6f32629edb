// ftrun-netdelay: packet delay, jitter and loss for one network namespace,
// through NFQUEUE, for kernels without sch_netem.
//
// The chaos harness delays a node (a Linux network namespace) with
// `tc qdisc ... netem` where it can; some kernels (this project's CI among
// them) have no netem. This tool does the same from user space: nftables
// sends every packet of the node to an NFQUEUE queue, and this program, run
// inside the node's namespace, gives each packet its verdict: NF_DROP with
// probability --loss-percent, else NF_ACCEPT once it has been held for
// --delay-ms (plus a uniform jitter in [-J, J] ms, clamped at 0). One
// thread: a min-heap of release times (FIFO among equal times), ppoll() on
// the netlink socket with the time to the earliest release as timeout, so
// packets go out in order of release time. Only metadata is copied
// (NFQNL_COPY_META) and GSO packets are queued whole (NFQA_CFG_F_GSO), so a
// TCP stream costs one message per super-packet.
//
//   ip netns exec NS ftrun-netdelay --queue N [--delay-ms D] [--jitter-ms J]
//       [--loss-percent P] [--seed S] [--install-rules]
//
// The rules. With nf_tables' native `queue` expression (CONFIG_NFT_QUEUE),
// the caller loads this in the node's namespace (`nft -f -`):
//
//   table inet ftrun_delay {}
//   delete table inet ftrun_delay
//   table inet ftrun_delay {
//     chain in {
//       type filter hook prerouting priority -300; policy accept;
//       iif "lo" accept
//       queue num N bypass
//     }
//     chain out {
//       type filter hook output priority -300; policy accept;
//       oif "lo" accept
//       queue num N bypass
//     }
//   }
//
// Many kernels (this machine's 6.18 among them) lack CONFIG_NFT_QUEUE:
// there `nft` says "Could not process rule: No such file or directory" on
// `queue`, and the xtables NFQUEUE target (CONFIG_NETFILTER_XT_TARGET_NFQUEUE,
// through nft_compat, as iptables-nft does it) is the way. `nft` cannot write
// compat expressions, so --install-rules makes this tool install the same
// rules itself over nf_tables netlink, in tables `ip ftrun_delay` and
// `ip6 ftrun_delay` (chains in/out as above): the native queue expression
// where the kernel has it, else `xt target NFQUEUE` (revision 3, flag
// bypass). Tables of those names are replaced. The iptables equivalent
// (needs the iptables package; not tried here, which has none):
//
//   iptables  -t raw -A PREROUTING ! -i lo -j NFQUEUE --queue-num N --queue-bypass
//   iptables  -t raw -A OUTPUT     ! -o lo -j NFQUEUE --queue-num N --queue-bypass
//   (and the same with ip6tables)
//
// `bypass` matters: when no program has the queue bound, packets pass, so a
// killed tool (SIGKILL leaves its rules) never cuts the node off. Every
// packet through the node is delayed on the way in (prerouting) and on the
// way out (output): a ping to the node sees its RTT grow by about 2 x D.
// ARP is not IP and is never delayed.
//
// Stopping. Deleting a base chain (hence a table) unregisters its hook, and
// the kernel then drops every packet queued in the namespace
// (nf_queue_nf_hook_drop); unbinding the queue drops the ones still queued
// to it. So on SIGTERM/SIGINT/SIGHUP this tool first deletes the queue rules
// but keeps the chains (--install-rules), then accepts every held packet in
// release order (and, with one batch verdict, any it had not read yet),
// then deletes its tables, then unbinds: no held packet is lost. A caller
// that installed the rules itself stops the tool first (SIGTERM, wait for
// its exit; only a packet queued between the tool's last verdict and its
// unbind can be lost) and deletes the table after: never delete the table
// while the tool holds packets. After a SIGKILL the kernel drops the
// held packets (the socket closes) and the caller deletes the leftover
// tables (`nft delete table ip ftrun_delay`, and ip6) or leaves them: with
// bypass they let everything through.
//
// Output: "ftrun-netdelay: queue N ready" on stdout (flushed) once the queue
// is bound and configured (and the rules installed); at exit one line of
// counters (seen, dropped, delayed, max held, ...), exit 0 after a stopping
// signal. Exit 2 for bad arguments (the message names the option), 1 for a
// system error (the message names the call and errno). Needs CAP_NET_ADMIN
// in the namespace.

// The libc network headers before the kernel's (linux/in.h, pulled in by
// linux/netfilter.h, yields to netinet/in.h only in this order).
#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
// The kernel's nfnetlink headers before libnetfilter_queue's (its own copy
// of them would win otherwise and lacks the nf_tables subsystem).
// clang-format off
#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nf_tables_compat.h>
#include <linux/netfilter/xt_NFQUEUE.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
// clang-format on

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr char kProg[] = "ftrun-netdelay";
constexpr uint32_t kQueueMaxLen = 16384;         // packets the kernel holds for us at most
constexpr int kRcvBufBytes = 64 << 20;           // netlink receive buffer (the kernel doubles it)
constexpr double kMaxDelayMs = 3600.0 * 1000.0;  // one hour: a sanity bound, not a need
constexpr size_t kVerdictBufBytes = 64 << 10;    // verdict messages sent per sendto()
constexpr int kRecvBurst = 1024;                 // messages read before releases are checked again
constexpr char kRuleTable[] = "ftrun_delay";

// ------------------------------------------------------------------ options

struct Options {
  int queue = -1;
  double delay_ms = 0;
  double jitter_ms = 0;
  double loss_percent = 0;
  std::optional<uint64_t> seed;
  bool install_rules = false;
};

const char kUsage[] =
    "usage: ftrun-netdelay --queue N [--delay-ms D] [--jitter-ms J] [--loss-percent P] [--seed S]\n"
    "                      [--install-rules]\n"
    "Run inside a network namespace (as root). Binds NFQUEUE queue N (0..65535); drops each packet\n"
    "with probability P percent (0..100), else releases it after D ms (>= 0) plus a uniform jitter\n"
    "in [-J, J] ms (clamped at 0). --seed makes the drops and the jitter reproducible.\n"
    "--install-rules: install (and at exit remove) nftables tables ip/ip6 ftrun_delay that queue\n"
    "every non-loopback packet of the namespace to N, with bypass. Stop it with SIGTERM or SIGINT.\n";

[[noreturn]] void UsageError(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n(see %s --help)\n", kProg, what.c_str(), kProg);
  std::exit(2);
}

double ParseNumber(const std::string& opt, const std::string& value, double lo, double hi, const char* expected) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v < lo || v > hi) {
    UsageError(opt + ": expected " + expected + ", got '" + value + "'");
  }
  return v;
}

uint64_t ParseUnsigned(const std::string& opt, const std::string& value, uint64_t hi, const char* expected) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(value.c_str(), &end, 10);
  if (value.empty() || value[0] == '-' || value[0] == '+' || *end != '\0' || errno == ERANGE || v > hi) {
    UsageError(opt + ": expected " + expected + ", got '" + value + "'");
  }
  return v;
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (arg == "--install-rules") {
      o.install_rules = true;
      continue;
    }
    std::string name = arg, value;
    bool has_value = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    bool known = name == "--queue" || name == "--delay-ms" || name == "--jitter-ms" || name == "--loss-percent" ||
                 name == "--seed";
    if (!known) UsageError("unknown argument '" + arg + "'");
    if (!has_value) {
      if (i + 1 >= argc) UsageError(name + ": missing value");
      value = argv[++i];
    }
    if (name == "--queue") {
      o.queue = static_cast<int>(ParseUnsigned(name, value, 65535, "a queue number 0..65535"));
    } else if (name == "--delay-ms") {
      o.delay_ms = ParseNumber(name, value, 0, kMaxDelayMs, "milliseconds >= 0 (at most 3600000)");
    } else if (name == "--jitter-ms") {
      o.jitter_ms = ParseNumber(name, value, 0, kMaxDelayMs, "milliseconds >= 0 (at most 3600000)");
    } else if (name == "--loss-percent") {
      o.loss_percent = ParseNumber(name, value, 0, 100, "a percentage 0..100");
    } else {
      o.seed = ParseUnsigned(name, value, UINT64_MAX, "an unsigned 64-bit integer");
    }
  }
  if (o.queue < 0) UsageError("--queue: required (the NFQUEUE number 0..65535 the rules send packets to)");
  return o;
}

// ------------------------------------------------------------------ errors and time

// "sendto (bind queue 3): Operation not permitted (EPERM)"
std::string ErrnoText(int err) {
  const char* name = strerrorname_np(err);
  return std::string(std::strerror(err)) + " (" + (name ? name : std::to_string(err)) + ")";
}

[[noreturn]] void Fatal(const std::string& what, int err) {
  std::fprintf(stderr, "%s: %s: %s\n", kProg, what.c_str(), ErrnoText(err).c_str());
  std::exit(1);
}

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct MnlCloser {
  void operator()(mnl_socket* s) const { mnl_socket_close(s); }
};
using MnlSocket = std::unique_ptr<mnl_socket, MnlCloser>;

MnlSocket OpenNetfilterSocket(const char* purpose) {
  MnlSocket s(mnl_socket_open(NETLINK_NETFILTER));
  if (!s) Fatal(std::string("socket(AF_NETLINK, NETLINK_NETFILTER) for ") + purpose, errno);
  if (mnl_socket_bind(s.get(), 0, MNL_SOCKET_AUTOPID) < 0) {
    Fatal(std::string("bind(AF_NETLINK) for ") + purpose, errno);
  }
  return s;
}

// ------------------------------------------------------------------ nftables rules (--install-rules)

// Builds an nfnetlink batch in one buffer. Attribute writes are not bounds
// checked by libmnl: the buffer is far larger than the few messages we put.
class Batch {
 public:
  Batch() : buf_(32 << 10) {}

  nlmsghdr* Begin(uint16_t type, uint16_t flags, uint8_t family, uint16_t res_id) {
    nlmsghdr* nlh = mnl_nlmsg_put_header(buf_.data() + off_);
    nlh->nlmsg_type = type;
    nlh->nlmsg_flags = NLM_F_REQUEST | flags;
    nlh->nlmsg_seq = ++seq_;
    auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
    nfg->nfgen_family = family;
    nfg->version = NFNETLINK_V0;
    nfg->res_id = htons(res_id);
    return nlh;
  }
  void End(nlmsghdr* nlh) {
    off_ += NLMSG_ALIGN(nlh->nlmsg_len);
    if (off_ + 4096 > buf_.size()) {
      std::fprintf(stderr, "%s: internal error: nf_tables batch too large\n", kProg);
      std::exit(1);
    }
    if (nlh->nlmsg_flags & NLM_F_ACK) acks_.push_back(nlh->nlmsg_seq);
  }
  // An nf_tables message: NFT_MSG_* for `family`, acknowledged.
  nlmsghdr* Nft(uint16_t msg, uint8_t family, uint16_t flags = 0) {
    return Begin(static_cast<uint16_t>((NFNL_SUBSYS_NFTABLES << 8) | msg), NLM_F_ACK | flags, family, 0);
  }

  const char* data() const { return buf_.data(); }
  size_t size() const { return off_; }
  const std::vector<uint32_t>& acks() const { return acks_; }

 private:
  std::vector<char> buf_;
  size_t off_ = 0;
  uint32_t seq_ = static_cast<uint32_t>(time(nullptr)) << 8;
  std::vector<uint32_t> acks_;
};

void PutBe32(nlmsghdr* nlh, uint16_t type, uint32_t v) { mnl_attr_put_u32(nlh, type, htonl(v)); }

// An expression list element: {NFTA_EXPR_NAME name, NFTA_EXPR_DATA {...}}.
void PutExpr(nlmsghdr* nlh, const char* name, const std::function<void()>& data) {
  nlattr* elem = mnl_attr_nest_start(nlh, NFTA_LIST_ELEM);
  mnl_attr_put_strz(nlh, NFTA_EXPR_NAME, name);
  nlattr* d = mnl_attr_nest_start(nlh, NFTA_EXPR_DATA);
  data();
  mnl_attr_nest_end(nlh, d);
  mnl_attr_nest_end(nlh, elem);
}

// `iif "lo" accept` (or oif): meta iif -> reg 1; cmp reg 1 == ifindex; immediate accept.
void PutLoopbackAcceptRule(Batch* b, uint8_t family, const char* chain, bool out, uint32_t lo_index) {
  nlmsghdr* nlh = b->Nft(NFT_MSG_NEWRULE, family, NLM_F_CREATE | NLM_F_APPEND);
  mnl_attr_put_strz(nlh, NFTA_RULE_TABLE, kRuleTable);
  mnl_attr_put_strz(nlh, NFTA_RULE_CHAIN, chain);
  nlattr* exprs = mnl_attr_nest_start(nlh, NFTA_RULE_EXPRESSIONS);
  PutExpr(nlh, "meta", [&] {
    PutBe32(nlh, NFTA_META_DREG, NFT_REG_1);
    PutBe32(nlh, NFTA_META_KEY, out ? NFT_META_OIF : NFT_META_IIF);
  });
  PutExpr(nlh, "cmp", [&] {
    PutBe32(nlh, NFTA_CMP_SREG, NFT_REG_1);
    PutBe32(nlh, NFTA_CMP_OP, NFT_CMP_EQ);
    nlattr* data = mnl_attr_nest_start(nlh, NFTA_CMP_DATA);
    mnl_attr_put(nlh, NFTA_DATA_VALUE, sizeof(lo_index), &lo_index);  // meta stores the index in host order
    mnl_attr_nest_end(nlh, data);
  });
  PutExpr(nlh, "immediate", [&] {
    PutBe32(nlh, NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
    nlattr* data = mnl_attr_nest_start(nlh, NFTA_IMMEDIATE_DATA);
    nlattr* verdict = mnl_attr_nest_start(nlh, NFTA_DATA_VERDICT);
    PutBe32(nlh, NFTA_VERDICT_CODE, NF_ACCEPT);
    mnl_attr_nest_end(nlh, verdict);
    mnl_attr_nest_end(nlh, data);
  });
  mnl_attr_nest_end(nlh, exprs);
  b->End(nlh);
}

// `queue num N bypass`: the native expression, or the xtables target through nft_compat.
void PutQueueRule(Batch* b, uint8_t family, const char* chain, uint16_t queue, bool compat) {
  nlmsghdr* nlh = b->Nft(NFT_MSG_NEWRULE, family, NLM_F_CREATE | NLM_F_APPEND);
  mnl_attr_put_strz(nlh, NFTA_RULE_TABLE, kRuleTable);
  mnl_attr_put_strz(nlh, NFTA_RULE_CHAIN, chain);
  nlattr* exprs = mnl_attr_nest_start(nlh, NFTA_RULE_EXPRESSIONS);
  if (!compat) {
    PutExpr(nlh, "queue", [&] {
      mnl_attr_put_u16(nlh, NFTA_QUEUE_NUM, htons(queue));
      mnl_attr_put_u16(nlh, NFTA_QUEUE_TOTAL, htons(1));
      mnl_attr_put_u16(nlh, NFTA_QUEUE_FLAGS, htons(NFT_QUEUE_FLAG_BYPASS));
    });
  } else {
    PutExpr(nlh, "target", [&] {
      // The kernel reads the target's own struct (host order), padded to XT_ALIGN like iptables sends it.
      char info[(sizeof(xt_NFQ_info_v3) + 7) & ~size_t{7}] = {};
      xt_NFQ_info_v3 nfq{};
      nfq.queuenum = queue;
      nfq.queues_total = 1;
      nfq.flags = NFQ_FLAG_BYPASS;
      std::memcpy(info, &nfq, sizeof(nfq));
      mnl_attr_put_strz(nlh, NFTA_TARGET_NAME, "NFQUEUE");
      PutBe32(nlh, NFTA_TARGET_REV, 3);
      mnl_attr_put(nlh, NFTA_TARGET_INFO, sizeof(info), info);
    });
  }
  mnl_attr_nest_end(nlh, exprs);
  b->End(nlh);
}

void PutTableReset(Batch* b, uint8_t family) {
  // "table X {}; delete table X": valid whether or not X exists.
  for (uint16_t msg : {NFT_MSG_NEWTABLE, NFT_MSG_DELTABLE}) {
    nlmsghdr* nlh = b->Nft(msg, family, msg == NFT_MSG_NEWTABLE ? NLM_F_CREATE : 0);
    mnl_attr_put_strz(nlh, NFTA_TABLE_NAME, kRuleTable);
    b->End(nlh);
  }
}

void PutRules(Batch* b, uint8_t family, uint16_t queue, bool compat, uint32_t lo_index) {
  PutTableReset(b, family);
  nlmsghdr* nlh = b->Nft(NFT_MSG_NEWTABLE, family, NLM_F_CREATE);
  mnl_attr_put_strz(nlh, NFTA_TABLE_NAME, kRuleTable);
  b->End(nlh);
  struct {
    const char* name;
    uint32_t hook;
    bool out;
  } chains[] = {{"in", NF_INET_PRE_ROUTING, false}, {"out", NF_INET_LOCAL_OUT, true}};
  for (const auto& c : chains) {
    nlh = b->Nft(NFT_MSG_NEWCHAIN, family, NLM_F_CREATE);
    mnl_attr_put_strz(nlh, NFTA_CHAIN_TABLE, kRuleTable);
    mnl_attr_put_strz(nlh, NFTA_CHAIN_NAME, c.name);
    nlattr* hook = mnl_attr_nest_start(nlh, NFTA_CHAIN_HOOK);
    PutBe32(nlh, NFTA_HOOK_HOOKNUM, c.hook);
    PutBe32(nlh, NFTA_HOOK_PRIORITY, static_cast<uint32_t>(-300));  // before conntrack (-200), like ftrun_fault
    mnl_attr_nest_end(nlh, hook);
    PutBe32(nlh, NFTA_CHAIN_POLICY, NF_ACCEPT);
    mnl_attr_put_strz(nlh, NFTA_CHAIN_TYPE, "filter");
    b->End(nlh);
  }
  for (const auto& c : chains) {
    PutLoopbackAcceptRule(b, family, c.name, c.out, lo_index);
    PutQueueRule(b, family, c.name, queue, compat);
  }
}

// Sends an nf_tables transaction (atomic: all or nothing) and waits for
// every acknowledgement. Returns 0 or the first error.
int RunTransaction(const std::function<void(Batch*)>& fill) {
  MnlSocket nl = OpenNetfilterSocket("nf_tables");
  Batch b;
  nlmsghdr* nlh = b.Begin(NFNL_MSG_BATCH_BEGIN, 0, AF_UNSPEC, NFNL_SUBSYS_NFTABLES);
  uint32_t begin_seq = nlh->nlmsg_seq;
  b.End(nlh);
  fill(&b);
  nlh = b.Begin(NFNL_MSG_BATCH_END, 0, AF_UNSPEC, NFNL_SUBSYS_NFTABLES);
  b.End(nlh);
  if (mnl_socket_sendto(nl.get(), b.data(), b.size()) < 0) Fatal("sendto (nf_tables batch)", errno);

  std::vector<uint32_t> pending = b.acks();
  int first_error = 0;
  int fd = mnl_socket_get_fd(nl.get());
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  while (!pending.empty()) {
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, 5000);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) Fatal("poll (nf_tables answer)", errno);
    if (r == 0) return first_error ? first_error : ETIMEDOUT;
    ssize_t n = mnl_socket_recvfrom(nl.get(), buf.data(), buf.size());
    if (n < 0) Fatal("recvmsg (nf_tables answer)", errno);
    int len = static_cast<int>(n);
    for (auto* m = reinterpret_cast<nlmsghdr*>(buf.data()); mnl_nlmsg_ok(m, len); m = mnl_nlmsg_next(m, &len)) {
      if (m->nlmsg_type != NLMSG_ERROR) continue;
      int err = -static_cast<const nlmsgerr*>(mnl_nlmsg_get_payload(m))->error;
      if (err && !first_error) first_error = err;
      if (m->nlmsg_seq == begin_seq && err) return first_error;  // the commit itself failed
      for (size_t i = 0; i < pending.size(); ++i) {
        if (pending[i] == m->nlmsg_seq) {
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
      }
    }
  }
  return first_error;
}

// Installs the ip and ip6 tables; returns "nft queue" or "xt NFQUEUE" (what queues).
std::string InstallRules(uint16_t queue) {
  uint32_t lo = if_nametoindex("lo");
  if (lo == 0) Fatal("if_nametoindex(\"lo\")", errno);
  int native_err = 0;
  for (bool compat : {false, true}) {
    int err = RunTransaction([&](Batch* b) {
      PutRules(b, NFPROTO_IPV4, queue, compat, lo);
      PutRules(b, NFPROTO_IPV6, queue, compat, lo);
    });
    if (err == 0) return compat ? "xt NFQUEUE (nft_compat)" : "nft queue";
    if (!compat) {  // usually ENOENT: no `queue` expression in this kernel; the batch left nothing behind
      native_err = err;
      continue;
    }
    Fatal("installing the nftables rules (nf_tables batch: tables ip/ip6 ftrun_delay, queue " + std::to_string(queue) +
              "; the native queue expression failed with " + ErrnoText(native_err) +
              ", the xtables NFQUEUE target with",
          err);
  }
  return "";
}

// Deletes the rules but keeps the chains: no packet is queued any more, and
// the held ones stay queued. (Deleting a base chain unregisters its hook,
// and the kernel then drops every packet queued anywhere in the namespace:
// nf_queue_nf_hook_drop. So the tables go only once the queue is empty.)
void StopQueueing() {
  for (uint8_t family : {NFPROTO_IPV4, NFPROTO_IPV6}) {  // one at a time: a missing table spoils no other
    int err = RunTransaction([&](Batch* b) {
      for (const char* chain : {"in", "out"}) {
        nlmsghdr* nlh = b->Nft(NFT_MSG_DELRULE, family);  // no handle: every rule of the chain
        mnl_attr_put_strz(nlh, NFTA_RULE_TABLE, kRuleTable);
        mnl_attr_put_strz(nlh, NFTA_RULE_CHAIN, chain);
        b->End(nlh);
      }
    });
    if (err && err != ENOENT) {  // ENOENT: someone deleted the table already
      std::fprintf(stderr, "%s: deleting the rules of %s %s: %s\n", kProg, family == NFPROTO_IPV4 ? "ip" : "ip6",
                   kRuleTable, ErrnoText(err).c_str());
    }
  }
}

void RemoveRules() {
  int err = RunTransaction([](Batch* b) {
    PutTableReset(b, NFPROTO_IPV4);
    PutTableReset(b, NFPROTO_IPV6);
  });
  if (err) std::fprintf(stderr, "%s: removing tables ip/ip6 ftrun_delay: %s\n", kProg, ErrnoText(err).c_str());
}

// ------------------------------------------------------------------ the queue

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
  DelayQueue(const Options& o, MnlSocket nl)
      : o_(o),
        nl_(std::move(nl)),
        fd_(mnl_socket_get_fd(nl_.get())),
        rng_(o.seed ? *o.seed : std::random_device{}()),
        loss_(0.0, 100.0),
        jitter_(-o.jitter_ms * 1e6, o.jitter_ms * 1e6),
        recv_buf_(MNL_SOCKET_BUFFER_SIZE * 2),
        verdicts_(kVerdictBufBytes) {}

  void Configure() {
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

  // Runs until a signal arrives on sigfd.
  void Run(int sigfd) {
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

  // Accepts every held packet (in release order) and whatever is still
  // unread in the socket, then every packet the kernel queued since: one
  // batch verdict (all ids up to the given one), and a verdict of its own
  // for each packet read after that (ENOENT, ignored, if the batch had it).
  void ReleaseAll() {
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

  // Unbinding drops whatever is still queued: call ReleaseAll() first.
  void Unbind() {
    char buf[MNL_SOCKET_BUFFER_SIZE];
    nlmsghdr* nlh = nfq_nlmsg_put(buf, NFQNL_MSG_CONFIG, o_.queue);
    nfq_nlmsg_cfg_put_cmd(nlh, AF_UNSPEC, NFQNL_CFG_CMD_UNBIND);
    if (int err = Request(nlh, "unbind")) Fatal("netlink unbind queue " + std::to_string(o_.queue), err);
  }

  const Counters& counters() const { return c_; }
  int first_verdict_error() const { return first_verdict_error_; }

 private:
  // Sends one message with NLM_F_ACK and waits for its answer (0 or an
  // errno); packet messages read meanwhile are handled as usual.
  int Request(nlmsghdr* nlh, const std::string& what) {
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

  // Reads up to `limit` messages without blocking.
  void ReadMessages(int limit) {
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

  void HandlePacket(const nlmsghdr* nlh, int64_t now) {
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

  void ReleaseDue(int64_t now) {
    while (!held_.empty() && held_.top().release_ns <= now) {
      PutVerdict(held_.top().id, NF_ACCEPT);
      ++c_.delayed;
      held_.pop();
    }
  }

  void PutVerdict(uint32_t id, int verdict) {
    if (verdict_len_ + 128 > verdicts_.size()) FlushVerdicts();
    nlmsghdr* nlh = nfq_nlmsg_put(verdicts_.data() + verdict_len_, NFQNL_MSG_VERDICT, o_.queue);
    nfq_nlmsg_verdict_put(nlh, static_cast<int>(id), verdict);
    verdict_len_ += NLMSG_ALIGN(nlh->nlmsg_len);
  }

  // One sendto() for all verdicts given since the last flush.
  void FlushVerdicts() {
    if (verdict_len_ == 0) return;
    if (mnl_socket_sendto(nl_.get(), verdicts_.data(), verdict_len_) < 0) Fatal("sendto (verdicts)", errno);
    verdict_len_ = 0;
  }

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

}  // namespace

int main(int argc, char** argv) {
  Options o = ParseOptions(argc, argv);

  // Signals arrive through a signalfd polled with the queue socket.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&stop_signals, s);
  if (sigprocmask(SIG_BLOCK, &stop_signals, nullptr) < 0) Fatal("sigprocmask", errno);
  int sigfd = signalfd(-1, &stop_signals, SFD_CLOEXEC);
  if (sigfd < 0) Fatal("signalfd", errno);
  signal(SIGPIPE, SIG_IGN);  // a harness that stopped reading our stdout must not kill us

  DelayQueue q(o, OpenNetfilterSocket("NFQUEUE"));
  q.Configure();
  std::string how;
  if (o.install_rules) how = InstallRules(static_cast<uint16_t>(o.queue));
  std::printf("%s: queue %d ready\n", kProg, o.queue);  // the first line, also with 2>&1
  std::fflush(stdout);
  if (o.install_rules)
    std::fprintf(stderr, "%s: rules installed (tables ip/ip6 %s, %s)\n", kProg, kRuleTable, how.c_str());

  q.Run(sigfd);
  if (o.install_rules) StopQueueing();
  q.ReleaseAll();
  if (o.install_rules) RemoveRules();
  q.Unbind();
  const Counters& c = q.counters();
  std::printf(
      "%s: queue %d: seen %llu, dropped %llu, delayed %llu, max held %llu, overruns %llu, verdict errors %llu\n", kProg,
      o.queue, static_cast<unsigned long long>(c.seen), static_cast<unsigned long long>(c.dropped),
      static_cast<unsigned long long>(c.delayed), static_cast<unsigned long long>(c.max_held),
      static_cast<unsigned long long>(c.overruns), static_cast<unsigned long long>(c.verdict_errors));
  std::fflush(stdout);
  if (c.max_held >= kQueueMaxLen) {
    std::fprintf(stderr, "%s: the queue was full (%u packets held): packets beyond that passed undelayed\n", kProg,
                 kQueueMaxLen);
  }
  if (c.verdict_errors) {
    std::fprintf(stderr, "%s: first verdict error: %s\n", kProg, ErrnoText(q.first_verdict_error()).c_str());
  }
  close(sigfd);
  return 0;
}
