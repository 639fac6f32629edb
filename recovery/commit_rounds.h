// CommitRounds: the coordinator's ledger of copies, and the commits it
// makes. Which live agents hold each rank's versions (their kHeld reports),
// which hold complete parity rows (kParityHeld), the commit round in
// progress, and the committed version.
//
// Version v is committed when every rank of the job has 1 + replicas live
// holders of it (with an erasure code: replicas is 0, and every node's
// parity rows are complete at v). A round targets one version at a time, the
// newest every rank holds locally (see cluster_messages.h: kReplicate).
// It decides rounds and commits and returns them; the coordinator
// (coordinator.h) sends the messages and decides what a recovery does with
// the copies it counts.
//
// Not thread-safe: owned by the coordinator.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "plugin/protocol/cluster_messages.h"
#include "recovery/membership.h"

namespace ftrun {

class CommitRounds {
 public:
  using Time = std::chrono::steady_clock::time_point;

  // replicas: 0 with an erasure code (members->erasure()).
  CommitRounds(const Membership* members, int replicas, std::chrono::milliseconds copy_timeout);

  std::optional<uint64_t> committed() const { return committed_; }

  // What the agents report.
  // kHeld of the current epoch: `agent` holds these (rank, version)s.
  void Held(PeerId agent, const std::vector<RankVersion>& items, Time now);
  // `agent`'s parity rows are complete at `version`.
  void ParityHeld(PeerId agent, uint64_t version);
  // A round's version failed at an agent (a node's ranks ran ahead and
  // released it): true when it was the round's version. Rounds then target
  // the newest version any rank saved, until the next epoch.
  bool RoundFailed(uint64_t version);
  // `agent` no longer holds (rank, version) (dropped, found missing).
  void NotHeld(PeerId agent, int rank, uint64_t version);
  // Every holder of (rank, version) failed a pull of it: none counts.
  void NoHolders(int rank, uint64_t version);
  // An agent (re)registering: what it reported before is void. It says
  // which ranks of `committed` it holds and, if any, the version its parity
  // rows cover (counted when `parity_counts`: it holds its node again).
  void Registered(PeerId agent, std::optional<uint64_t> committed, const std::vector<RankVersion>& catalog,
                  std::optional<uint64_t> parity, bool parity_counts);

  // Epochs and timelines.
  // A recovery began: reports of versions above the committed one are void
  // (the new epoch reports again), and so is the round.
  void NewEpoch();
  // The job goes back to `version` (on disk): it is the committed version,
  // nothing held counts, and parity above it is another timeline's.
  void GoBackTo(uint64_t version);
  // The ranks started: the time without a commit counts from now.
  void Started(Time now) { last_commit_ = stall_warned_ = now; }

  // Decisions; the coordinator sends what they return.
  // A version newly committed, if any (the bookkeeping of older ones done).
  std::optional<uint64_t> Commit(Time now);
  // A version a new round should replicate, if any (now the round's).
  std::optional<uint64_t> Target(Time now);
  // No commit for 3 x copy_timeout while ranks save newer versions: what
  // lags, for a warning (again every 3 x copy_timeout); nothing otherwise.
  std::optional<std::string> Stalled(Time now);

  // What the copies are.
  std::vector<PeerId> HoldersAlive(int rank, uint64_t version) const;
  bool DataAt(int slot, uint64_t version) const;    // its agent is alive and holds its ranks
  bool ParityAt(int slot, uint64_t version) const;  // its agent is alive with its rows complete
  bool ParityComplete(uint64_t version) const;      // every slot's
  // Fragments of `stripe` of erasure group `group` there at `version`.
  int StripeFragments(int group, int stripe, uint64_t version) const;
  // More losses the group survives at `version`: the fewest spare
  // fragments of its stripes (negative: a lost node cannot be rebuilt).
  int GroupMargin(int group, uint64_t version) const;
  // Live copies of the committed version per rank (empty: none committed).
  std::vector<int> CommittedCopies() const;

  uint64_t commits() const { return commits_; }
  uint64_t held_reports() const { return held_reports_; }
  std::optional<double> last_commit_lag_ms() const { return last_commit_lag_ms_; }

 private:
  // Versions above the committed one whose copies are counted, at most.
  static constexpr size_t kMaxHeldVersions = 1024;

  const Membership* members_;
  const int replicas_;
  const std::chrono::milliseconds copy_timeout_;
  std::optional<uint64_t> committed_;
  std::map<uint64_t, std::map<int, std::set<PeerId>>> held_;  // version -> rank -> agents
  std::map<uint64_t, Time> held_since_;  // version -> when every rank had saved it (bounded as held_)
  // version -> ranks whose holders reached 1 + replicas when a report came
  // in: never below the ranks with that many live holders (holders of a
  // version above the committed one are added only by reports), so a commit
  // check runs only once it reaches every rank, not on every report
  // (O(ranks) each: at 32k ranks that was the coordinator's whole CPU).
  std::map<uint64_t, int> filled_;
  std::map<uint64_t, std::set<PeerId>> parity_held_;  // version -> agents whose rows are complete there
  std::optional<uint64_t> target_;                    // the version being replicated
  Time target_since_{};
  // A round failed this epoch: rounds target the newest version any rank
  // saved; agents copy it when their ranks reach it.
  bool ahead_ = false;
  Time last_commit_{};  // or the start of the epoch
  Time stall_warned_{};
  uint64_t commits_ = 0;
  uint64_t held_reports_ = 0;
  std::optional<double> last_commit_lag_ms_;
};

}  // namespace ftrun
