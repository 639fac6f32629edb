#include "launcher/agent/agent.h"

#include <signal.h>
#include <unistd.h>

#include "launcher/agent/rank_env.h"
#include "plugin/common/duration.h"
#include "plugin/common/log.h"
#include "plugin/common/safe_dir.h"
#include "plugin/config/units.h"
#include "plugin/persist/persist_reader.h"

namespace ftrun {
namespace {

constexpr auto kTick = std::chrono::milliseconds(20);

}  // namespace

Agent::Agent(AgentOptions options, const ftrun::Clock& clock) : o_(std::move(options)), clock_(clock), store_(clock) {}
Agent::~Agent() = default;

Status Agent::Setup() {
  const Config& c = o_.config;
  // First: every thread started later inherits the signal mask, so these
  // signals only ever arrive through the loop.
  FTRUN_RETURN_IF_ERROR(loop_.Open({SIGCHLD, SIGTERM, SIGINT, SIGHUP}, kTick));
  if (o_.each_rank_log_dir.empty()) {
    rank_output_ = std::make_unique<RankOutput>(STDOUT_FILENO, STDERR_FILENO, c.job.output_prefix);
    FTRUN_RETURN_IF_ERROR(rank_output_->Start());
  }
  FTRUN_RETURN_IF_ERROR(InstanceLock::Claim(c.agent.run_dir, o_.job_id, o_.agent_id, &lock_));
  if (lock_.removed_stale_socket()) {
    FTRUN_LOG_WARN("removed a stale socket {} left by an agent that is gone", lock_.socket_path());
  }
  FTRUN_RETURN_IF_ERROR(store_.Open(o_.job_id, static_cast<uint32_t>(o_.agent_id), c.store));
  SnapshotStore* catalog = store_.catalog();
  recoveries_ = std::make_unique<RecoveryLog>(clock_);
  RankProcesses::Options ro;
  ro.stop_grace = c.job.stop_grace;
  ro.hang_timeout = c.job.hang_timeout;
  ranks_ = std::make_unique<RankProcesses>(clock_, ro);
  ranks_->Assign(o_.first_global_rank, o_.spare ? 0 : o_.local_ranks);
  NodeDisk::Options d;
  d.config = c.persist;
  d.job_id = o_.job_id;
  d.arena_base = store_.base();
  d.leased = remote();
  d.ranks = [this] { return ranks_->Ranks(); };
  disk_ = std::make_unique<NodeDisk>(std::move(d), catalog, clock_);
  disk_->Assign(o_.node_rank, o_.world_size);
  disk_->watch = [this](int fd) { return loop_.Add(fd, kFlushTag); };
  CorruptChunks::Repair repair;  // from the chunk's file in the persist directory (its hash checked)
  if (persist()) {
    repair = [this](const ChunkRef& ref, char* dst) {
      if (!persist()) return Status::FailedPrecondition("persist.dir is off");
      return PersistReader(nullptr, disk_->dir(), o_.job_id, o_.world_size).CheckChunkFile(ref, dst);
    };
  }
  corrupt_ = std::make_unique<CorruptChunks>(catalog, store_.base(), std::move(repair),
                                             "the persist directory (" + disk_->dir() + ")");
  corrupt_->on_change = [this] { status_dirty_ = true; };
  store_.service()->on_saved = [this](int rank, uint64_t version) {
    if (RankSlot* s = ranks_->ByRank(rank)) generations_->RankEvent(*s, &RankSlot::first_step);
    member_->RankSaved(rank, version);
  };
  store_.service()->on_committed = [this](uint64_t version) {
    status_dirty_ = true;
    if (!ranks_->slots().empty()) disk_->Committed(version, commit_epoch_);
  };

  FTRUN_RETURN_IF_ERROR(BecomeSubreaper());
  ::signal(SIGPIPE, SIG_IGN);
  RankServer::Handler h;
  h.on_frame = [this](Connection& conn, MsgType type, const std::string& payload) {
    requests_->Frame(conn, type, payload);
  };
  h.on_close = [this](Connection& conn) { requests_->Closed(conn); };
  server_ = std::make_unique<RankServer>(&loop_, clock_, std::move(h));
  server_->set_max_pending_hello(2 * ranks_->slots().size());
  FTRUN_RETURN_IF_ERROR(server_->Listen(lock_.socket_path(), kListenTag));
  ClusterMember::Orders* orders = this;
  member_ = std::make_unique<ClusterMember>(
      MemberOptions(), catalog, store_.base(), store_.retention(), [this] { return ranks_->Ranks(); }, orders, clock_);
  disk_recovery_ = std::make_unique<DiskRecovery>(
      DiskRecovery::Parts{catalog, store_.base(), disk_.get(), store_.tracker(), store_.retention(), member_.get(),
                          &loop_, kDiskTag},
      [this] {
        return DiskRecovery::Place{o_.job_id, o_.world_size, o_.node_rank};
      },
      [this](uint64_t version) { Committed(version); }, clock_);
  warm_ = std::make_unique<WarmRanks>(ranks_.get(), server_.get(), WarmHooks(),
                                      WarmRanks::Options{c.restart.warm_standbys, c.restart.abort_timeout}, clock_);
  Generations::Options go;
  go.max_restarts = c.job.max_restarts;
  go.hang_timeout = c.job.hang_timeout;
  generations_ = std::make_unique<Generations>(GenerationParts(), GenerationHooks(), go, clock_);
  requests_ = std::make_unique<RankRequests>(
      RankRequests::Parts{server_.get(), ranks_.get(), generations_.get(), store_.service(), corrupt_.get(),
                          warm_.get(), &stalls_},
      [this] {
        return RankRequests::Place{
            o_.job_id,          o_.node_rank, o_.first_global_rank, o_.local_ranks, o_.config.store.chunk_size,
            store_.arena().fd()};
      },
      clock_);
  FTRUN_RETURN_IF_ERROR(member_->Setup());
  if (remote()) FTRUN_RETURN_IF_ERROR(loop_.Add(member_->event_fd(), kTransportTag));
  if (!c.metrics.agent_listen.empty()) {
    Status ms = ServedMetrics<AgentMetrics>::Start(c.metrics.agent_listen, &metrics_, o_.job_id, o_.node_rank);
    if (ms.ok()) {
      FTRUN_LOG_INFO("metrics at http://{}/metrics", metrics_->address());
    } else {
      FTRUN_LOG_WARN("{} (metrics.agent_listen): the job runs without them", ms.message());
    }
  }
  if (o_.save_pid > 0) {
    // /tmp is shared: created new, never through a link (safe_dir.h).
    FTRUN_RETURN_IF_ERROR(
        CreateNewFile("/tmp/" + std::to_string(o_.save_pid) + ".deepspeed", std::to_string(::getpid()) + "\n"));
  }
  return Status::Ok();
}

int Agent::Run() {
  Status s = Setup();
  if (!s.ok()) {
    FTRUN_LOG_ERROR("cannot start: {}", s.message());
    return 2;
  }
  FTRUN_LOG_INFO("job {} node {}: {} ranks (global {}..{} of {}), store {} in {} chunks, socket {}", o_.job_id,
                 o_.node_rank, o_.local_ranks, o_.first_global_rank, o_.first_global_rank + o_.local_ranks - 1,
                 o_.world_size, FormatSize(store_.arena().data_bytes()), FormatSize(o_.config.store.chunk_size),
                 lock_.socket_path());
  if (const std::string notice = ThreadsNotice(o_); !notice.empty()) FTRUN_LOG_INFO("{}", notice);
  member_->Pump();  // the coordinator says when to start (or what to restore from disk first)
  Loop();
  disk_->Drain(store_.service()->last_committed(), fenced_);
  WriteStatus();
  return generations_->exit_code();
}

void Agent::Loop() {
  std::vector<EventLoop::Ready> ready;
  while (!generations_->done()) {
    if (Status s = loop_.Wait(&ready); !s.ok()) {
      FTRUN_LOG_ERROR("{}", s.message());
      generations_->Abort(2);
      return;
    }
    for (size_t i = 0; i < ready.size() && !generations_->done(); ++i) {
      const uint64_t tag = ready[i].tag;
      if (tag == kListenTag)
        server_->Accept();
      else if (tag == EventLoop::kSignalTag)
        Signals();
      else if (tag == EventLoop::kTickTag)
        Tick();
      else if (tag == kTransportTag)
        member_->Events([this] { return generations_->done(); });
      else if (tag == kFlushTag)
        disk_->OnEvent();
      else if (tag == kDiskTag)
        disk_recovery_->OnEvent();
      else if (server_->Owns(tag))
        server_->Ready(tag, ready[i].events);
    }
    server_->Sync();
    member_->FlushHeld();
    member_->Pump();
  }
}

}  // namespace ftrun
