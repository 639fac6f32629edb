// ftrun-bench scale's parts (see scale_sim.h).
#include "bench/scale_sim.h"

#include <time.h>

#include <algorithm>

#include "recovery/coordinator_json.h"

namespace ftrun::bench {

using std::chrono::milliseconds;

void Mailbox::Push(Envelope e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(std::move(e));
  }
  cv_.notify_one();
}

void Mailbox::PushAll(std::vector<Envelope>* batch) {
  if (batch->empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Envelope& e : *batch) q_.push_back(std::move(e));
  }
  batch->clear();
  cv_.notify_one();
}

std::vector<Envelope> Mailbox::Take(SimTime until) {
  std::vector<Envelope> out;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, until, [&] { return !q_.empty(); });
  out.swap(q_);
  return out;
}

CoordinatorThread::CoordinatorThread(Coordinator::Options options, Mailbox* inbox, Mailbox* to_agents)
    : inbox_(inbox), to_agents_(to_agents), coordinator_(std::move(options), this), thread_([this] { Run(); }) {}

CoordinatorThread::~CoordinatorThread() {
  stop_ = true;
  inbox_->Push({});  // wakes it
  thread_.join();
}

void CoordinatorThread::Send(PeerId to, ClusterMsg type, std::string payload) {
  outgoing_.push_back({to, static_cast<uint16_t>(type), std::move(payload)});
}

void RunnerTimers::Run(SimTime now) {
  if (now >= next_tick_) {
    c_->Tick(now);
    next_tick_ = now + milliseconds(20);  // the runner's loop period
  }
  if (now >= next_status_) {
    // The runner writes status.json (and the metrics) from this view.
    const std::string status = StatusJson(c_->View()).dump(2);
    next_status_ = now + milliseconds(200);
    (void)status;
  }
}

void CoordinatorThread::Run() {
  RunnerTimers timers(&coordinator_);
  while (!stop_) {
    std::vector<Envelope> batch = inbox_->Take(timers.next_tick());
    for (const Envelope& e : batch) {
      if (e.peer == 0) continue;
      if (e.type == kConnectionClosed)
        coordinator_.OnPeerDown(e.peer, "connection closed", SimClock::now());
      else
        coordinator_.OnMessage(e.peer, e.type, e.payload, SimClock::now());
    }
    in_ += batch.size();
    timers.Run(SimClock::now());
    out_ += outgoing_.size();
    to_agents_->PushAll(&outgoing_);
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    cpu_ns_ = int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
  }
}

Fleet::Fleet(int nodes, int spares, int ranks_per_node, Mailbox* inbox, Mailbox* to_coordinator, uint64_t seed)
    : nodes_(nodes), ranks_per_node_(ranks_per_node), inbox_(inbox), to_coordinator_(to_coordinator), rng_(seed) {
  agents_.resize(static_cast<size_t>(nodes + spares));
  for (size_t i = 0; i < agents_.size(); ++i) agents_[i].id = static_cast<PeerId>(i + 1);
}

void Fleet::RegisterAll() {
  std::vector<Envelope> out;
  for (Agent& a : agents_) {
    RegisterMsg m;
    m.slot = a.id <= static_cast<PeerId>(nodes_) ? static_cast<int32_t>(a.id - 1) : -1;
    m.address = "10." + std::to_string(a.id >> 16) + "." + std::to_string((a.id >> 8) & 255) + "." +
                std::to_string(a.id & 255) + ":7000";
    out.push_back({a.id, static_cast<uint16_t>(ClusterMsg::kRegister), Encode(m)});
  }
  Flush(&out);
}

std::vector<RankVersion> Fleet::RanksAt(int slot, uint64_t v) const {
  std::vector<RankVersion> items;
  for (int i = 0; i < ranks_per_node_; ++i) items.push_back({slot * ranks_per_node_ + i, v});
  return items;
}

void Fleet::Flush(std::vector<Envelope>* replies) {
  std::shuffle(replies->begin(), replies->end(), rng_);
  std::vector<uint64_t> versions;
  for (const Envelope& e : *replies) {
    if (e.type == static_cast<uint16_t>(ClusterMsg::kHeld)) versions.push_back(e.version);
  }
  const SimTime now = SimClock::now();
  for (const Envelope& e : *replies) agents_[e.peer - 1].last_sent = now;
  to_coordinator_->PushAll(replies);
  for (uint64_t v : versions) last_report[v] = now;
}

void Fleet::Heartbeats(SimClock::duration interval) {
  std::vector<Envelope> out;
  const SimTime now = SimClock::now();
  for (Agent& a : agents_) {
    if (a.silent || now - a.last_sent < interval) continue;
    out.push_back({a.id, static_cast<uint16_t>(ClusterMsg::kHeartbeat), Encode(HeartbeatMsg{a.epoch})});
    a.last_sent = now;
  }
  to_coordinator_->PushAll(&out);
}

void Fleet::Save(uint64_t v) {
  std::vector<Envelope> out;
  for (const Agent& a : agents_) {
    if (a.silent || a.slot < 0) continue;
    out.push_back({a.id, static_cast<uint16_t>(ClusterMsg::kHeld), Encode(HeldMsg{a.epoch, RanksAt(a.slot, v)}), v});
  }
  Flush(&out);
}

PeerId Fleet::Silence(int slot) {
  for (Agent& a : agents_) {
    if (a.slot == slot && !a.silent) {
      a.silent = true;
      silent_++;
      live_in_slots_ = -1;
      return a.id;
    }
  }
  return 0;
}

PeerId Fleet::Kill(int slot) {
  const PeerId id = Silence(slot);
  if (id != 0) to_coordinator_->Push({id, kConnectionClosed, {}});
  return id;
}

int Fleet::LiveInSlots() {
  if (live_in_slots_ < 0) {
    live_in_slots_ = 0;
    for (const Agent& a : agents_) live_in_slots_ += a.slot >= 0 && !a.silent;
  }
  return live_in_slots_;
}

void Fleet::Pump(SimTime until) {
  std::vector<Envelope> replies;
  do {
    for (const Envelope& e : inbox_->Take(until)) {
      if (e.peer >= 1 && e.peer <= agents_.size()) Handle(agents_[e.peer - 1], e, &replies);
    }
    Flush(&replies);
  } while (SimClock::now() < until);
}

void Fleet::Handle(Agent& a, const Envelope& e, std::vector<Envelope>* replies) {
  if (a.silent) return;
  const SimTime now = SimClock::now();
  auto reply = [&](ClusterMsg type, std::string payload, uint64_t version = 0) {
    replies->push_back({a.id, static_cast<uint16_t>(type), std::move(payload), version});
  };
  switch (static_cast<ClusterMsg>(e.type)) {
    case ClusterMsg::kAssign: {
      AssignMsg m;
      if (Decode(e.payload, &m).ok()) a.slot = m.slot;
      live_in_slots_ = -1;
      break;
    }
    case ClusterMsg::kMembership: {
      MembershipMsg m;
      if (!Decode(e.payload, &m).ok()) break;
      a.epoch = m.epoch;
      a.held_slots = m.held_slots;
      break;
    }
    case ClusterMsg::kHalt: {
      HaltMsg m;
      if (!Decode(e.payload, &m).ok()) break;
      a.epoch = m.epoch;
      if (a.halted_in != m.epoch && a.slot >= 0) {
        a.halted_in = m.epoch;
        // Every node that is not silent, counted at the first halt (a spare
        // may take the lost node's slot before the last halt lands).
        if (halted_[m.epoch]++ == 0) {
          first_halt[m.epoch] = now;
          halts_due_[m.epoch] = LiveInSlots();
        }
        if (halted_[m.epoch] == halts_due_[m.epoch]) all_halted[m.epoch] = now;
      }
      reply(ClusterMsg::kHalted, Encode(HaltedMsg{m.epoch}));
      break;
    }
    case ClusterMsg::kPull: {
      PullMsg m;
      if (Decode(e.payload, &m).ok()) reply(ClusterMsg::kReady, Encode(ReadyMsg{m.epoch}));
      break;
    }
    case ClusterMsg::kStart: {
      StartMsg m;
      if (!Decode(e.payload, &m).ok()) break;
      a.epoch = m.epoch;
      if (a.started_in != m.epoch) {
        a.started_in = m.epoch;
        if (++started_[m.epoch] == nodes_) all_started[m.epoch] = now;
      }
      break;
    }
    case ClusterMsg::kReplicate: {
      ReplicateMsg m;
      if (!Decode(e.payload, &m).ok() || m.epoch != a.epoch || a.held_slots.empty()) break;
      std::vector<RankVersion> items;
      for (int32_t s : a.held_slots) {
        for (const RankVersion& rv : RanksAt(s, m.version)) items.push_back(rv);
      }
      reply(ClusterMsg::kHeld, Encode(HeldMsg{a.epoch, std::move(items)}), m.version);
      break;
    }
    case ClusterMsg::kCommit: {
      CommitMsg m;
      if (Decode(e.payload, &m).ok() && ++commits_[m.version] == agents() - silent_) committed_at[m.version] = now;
      break;
    }
    default:
      break;  // coordinator heartbeats, stops
  }
}

}  // namespace ftrun::bench
