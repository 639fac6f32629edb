#include "launcher/agent/commit_round.h"

namespace ftrun {

void CommitRound::Begin(uint64_t v, const std::vector<int>& ranks) {
  version_ = v;
  waiting_.clear();
  for (int rank : ranks) {
    if (store_->Find(rank, v)) continue;
    auto last = store_->LastSaved(rank);
    if (last && *last >= v) return Fail(v);  // released meanwhile
    waiting_.insert(rank);
  }
  for (int rank : ranks) {
    if (!waiting_.count(rank)) copy_(rank, v);
  }
}

void CommitRound::Saved(int rank, uint64_t v) {
  if (!version_ || !waiting_.erase(rank)) return;
  if (v == *version_) {
    copy_(rank, v);
  } else if (v > *version_ && !store_->Find(rank, *version_)) {
    Fail(*version_);  // the rank skipped it
  } else {
    waiting_.insert(rank);
  }
}

void CommitRound::End() {
  version_.reset();
  waiting_.clear();
}

void CommitRound::Fail(uint64_t v) {
  waiting_.clear();
  failed_(v);
}

}  // namespace ftrun
