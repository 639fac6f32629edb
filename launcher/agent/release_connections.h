// Releasing a survivor blocked in a collective (warm_ranks.h): gloo on
// torch 1.13 has no abort, and a process may be stuck in torch code that
// holds the GIL (the rendezvous store's constructor), so nothing inside it
// can help. The agent, its parent, takes a duplicate of each of its TCP
// connections (pidfd_getfd, Linux >= 5.6) and shuts it down: every pending
// operation on it fails, and the process's own code raises. The
// descriptors stay the process's; only connections opened in the current
// generation are touched (not those it had when it began it), never a
// listener (shutting one down kills torch's server threads), and never the
// rendezvous store's own side (local port MASTER_PORT).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <set>
#include <string>

#include "ftrun/status.h"

namespace ftrun {

// The inodes of the sockets `pid` has open (/proc/<pid>/fd).
std::set<uint64_t> SocketInodes(pid_t pid);

// Shuts down `pid`'s connected TCP sockets whose inodes are not in
// `*settled`, but listeners and those bound to local port `store_port`, and
// adds to `*settled` every socket it is done with: those it shut down and
// those never to be (listeners, the store's side, anything not TCP). A TCP
// socket not connected yet (a client inside connect(): the store's, on a
// loaded machine) is left out, so that the next call looks at it again.
// *released: how many it shut down. An error when the process cannot be
// reached.
Status ReleaseConnections(pid_t pid, int store_port, std::set<uint64_t>* settled, int* released);

}  // namespace ftrun
