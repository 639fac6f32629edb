#include "launcher/agent/rank_output.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

namespace ftrun {

namespace {

void WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // the agent's stderr is gone: the tail is still kept
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

RankOutput::RankOutput(int sink) : sink_(sink) {}

RankOutput::~RankOutput() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  if (wake_.valid()) {
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
}

Status RankOutput::Start() {
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) return Status::FromErrno("epoll_create1 (rank output)", errno);
  wake_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_.valid()) return Status::FromErrno("eventfd (rank output)", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_.get();
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0)
    return Status::FromErrno("epoll_ctl (rank output)", errno);
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

Status RankOutput::NewPipe(int rank, UniqueFd* write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno("pipe2 (rank " + std::to_string(rank) + " stderr)", errno);
  UniqueFd rd(fds[0]);
  write_end->Reset(fds[1]);
  ::fcntl(rd.get(), F_SETFL, ::fcntl(rd.get(), F_GETFL) | O_NONBLOCK);
  std::lock_guard<std::mutex> l(mu_);
  int key = rd.get();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = key;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, key, &ev) != 0) {
    write_end->Reset();
    return Status::FromErrno("epoll_ctl (rank " + std::to_string(rank) + " stderr)", errno);
  }
  Pipe& p = pipes_[key];
  p.rank = rank;
  p.fd = std::move(rd);
  current_[rank] = key;
  return Status::Ok();
}

bool RankOutput::DrainLocked(Pipe& p) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(p.fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    if (n <= 0) return false;
    WriteAll(sink_, buf, static_cast<size_t>(n));
    p.tail.append(buf, static_cast<size_t>(n));
    if (p.tail.size() > kTailBytes) p.tail.erase(0, p.tail.size() - kTailBytes);
  }
}

void RankOutput::Run() {
  std::vector<epoll_event> evs(32);
  for (;;) {
    int n = ::epoll_wait(epoll_.get(), evs.data(), static_cast<int>(evs.size()), -1);
    if (n < 0 && errno == EINTR) continue;
    std::lock_guard<std::mutex> l(mu_);
    if (stop_ || n < 0) return;
    for (int i = 0; i < n; ++i) {
      int key = evs[i].data.fd;
      if (key == wake_.get()) continue;
      auto it = pipes_.find(key);
      if (it == pipes_.end() || DrainLocked(it->second)) continue;
      // EOF: every holder of the write end (the rank and its children) is
      // gone. The tail stays readable while this is the rank's newest pipe.
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, key, nullptr);
      auto cur = current_.find(it->second.rank);
      if (cur != current_.end() && cur->second == key) {
        // Keep the entry (its tail) under a key no fd can have.
        const int rank = it->second.rank;
        it->second.fd.Reset();
        pipes_[-1 - rank] = std::move(it->second);
        cur->second = -1 - rank;
      }
      pipes_.erase(it);
    }
  }
}

std::string RankOutput::Tail(int rank, size_t max_lines) {
  std::lock_guard<std::mutex> l(mu_);
  auto cur = current_.find(rank);
  if (cur == current_.end()) return {};
  Pipe& p = pipes_[cur->second];
  if (p.fd.valid()) DrainLocked(p);
  return LastLines(p.tail, max_lines);
}

std::string RankLogPath(const std::string& dir, int rank) { return dir + "/rank" + std::to_string(rank) + ".log"; }

std::string LastLines(const std::string& t, size_t max_lines) {
  // Back from the end over max_lines line breaks.
  size_t end = t.size();
  while (end > 0 && t[end - 1] == '\n') --end;
  size_t start = end, lines = 0;
  while (start > 0) {
    if (t[start - 1] == '\n' && ++lines == max_lines) break;
    --start;
  }
  return t.substr(start, end - start);
}

std::string FileTail(const std::string& path, size_t max_lines) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return {};
  off_t size = ::lseek(fd.get(), 0, SEEK_END);
  std::string t(static_cast<size_t>(std::min<off_t>(std::max<off_t>(size, 0), 4096)), '\0');
  ssize_t n = ::pread(fd.get(), t.data(), t.size(), size - static_cast<off_t>(t.size()));
  t.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return LastLines(t, max_lines);
}

}  // namespace ftrun
