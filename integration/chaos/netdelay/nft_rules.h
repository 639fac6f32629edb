// --install-rules: ftrun-netdelay's own nftables rules, tables `ip
// ftrun_delay` and `ip6 ftrun_delay` with chains in (prerouting) and out
// (output) that accept loopback and queue every other packet to the queue,
// with bypass. Written over nf_tables netlink as atomic transactions: the
// native queue expression where the kernel has it, else the xtables NFQUEUE
// target through nft_compat (integration/chaos/netdelay/main.cc says why).
#pragma once

#include <cstdint>
#include <string>

namespace ftrun::netdelay {

constexpr char kRuleTable[] = "ftrun_delay";

// Installs the ip and ip6 tables (replacing tables of those names); returns
// what queues: "nft queue" or "xt NFQUEUE (nft_compat)". Exits (Fatal) when
// neither works.
std::string InstallRules(uint16_t queue);

// Deletes the queue rules but keeps the chains, so that the packets held
// stay queued (deleting a chain would drop them); RemoveRules() once the
// queue is empty.
void StopQueueing();

// Deletes both tables.
void RemoveRules();

}  // namespace ftrun::netdelay
