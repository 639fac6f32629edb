#include "integration/chaos/netdelay/nft_rules.h"

// The libc network headers before the kernel's (linux/in.h, pulled in by
// linux/netfilter.h, yields to netinet/in.h only in this order).
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
// clang-format off
#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nf_tables_compat.h>
#include <linux/netfilter/xt_NFQUEUE.h>
// clang-format on

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "integration/chaos/netdelay/netlink.h"

namespace ftrun::netdelay {
namespace {

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

}  // namespace

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

}  // namespace ftrun::netdelay
