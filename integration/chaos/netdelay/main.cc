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
//
// The parts: options (the command line), netlink (errors, the clock,
// netfilter sockets), nft_rules (--install-rules), delay_queue (the queue
// and its verdicts).
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "integration/chaos/netdelay/delay_queue.h"
#include "integration/chaos/netdelay/netlink.h"
#include "integration/chaos/netdelay/nft_rules.h"
#include "integration/chaos/netdelay/options.h"

namespace ftrun::netdelay {
namespace {

int Main(int argc, char** argv) {
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

}  // namespace
}  // namespace ftrun::netdelay

int main(int argc, char** argv) { return ftrun::netdelay::Main(argc, argv); }
