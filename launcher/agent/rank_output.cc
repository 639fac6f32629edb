#include "launcher/agent/rank_output.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
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

RankOutput::RankOutput(int out, int err, bool prefix) : out_(out), err_(err), prefix_(prefix) {}

RankOutput::~RankOutput() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    // What the ranks wrote last (their final lines, just before they
    // exited) goes out before the agent does.
    for (auto& [key, p] : pipes_) {
      if (p.fd.valid()) DrainLocked(p);
      ForwardLocked(p, true);
    }
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

Status RankOutput::NewPipes(int rank, UniqueFd* stdout_write, UniqueFd* stderr_write) {
  FTRUN_RETURN_IF_ERROR(AddPipe(rank, out_, false, stdout_write));
  return AddPipe(rank, err_, true, stderr_write);
}

Status RankOutput::AddPipe(int rank, int sink, bool keep_tail, UniqueFd* write_end) {
  const char* what = keep_tail ? " stderr)" : " stdout)";
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno("pipe2 (rank " + std::to_string(rank) + what, errno);
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
    return Status::FromErrno("epoll_ctl (rank " + std::to_string(rank) + what, errno);
  }
  Pipe& p = pipes_[key];
  p.rank = rank;
  p.sink = sink;
  p.keep_tail = keep_tail;
  p.fd = std::move(rd);
  if (keep_tail) current_[rank] = key;
  return Status::Ok();
}

void RankOutput::ForwardLocked(Pipe& p, bool all) {
  size_t end = all ? p.held.size() : p.held.find_last_of("\n\r");
  if (end == std::string::npos || end == 0) return;
  if (!all) ++end;  // the line break goes too
  if (!prefix_) {
    WriteAll(p.sink, p.held.data(), end);
  } else {
    const std::string tag = "[rank " + std::to_string(p.rank) + "]: ";
    std::string out;
    out.reserve(end + tag.size() * 4);
    for (size_t at = 0; at < end;) {
      size_t eol = p.held.find_first_of("\n\r", at);
      eol = eol == std::string::npos || eol >= end ? end : eol + 1;
      out += tag;
      out.append(p.held, at, eol - at);
      at = eol;
    }
    if (all && !out.empty() && out.back() != '\n' && out.back() != '\r') out += '\n';
    WriteAll(p.sink, out.data(), out.size());
  }
  p.held.erase(0, end);
}

bool RankOutput::DrainLocked(Pipe& p) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(p.fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    if (n <= 0) {
      ForwardLocked(p, true);  // a last line with no line break
      return false;
    }
    const size_t before = p.held.size();
    p.held.append(buf, static_cast<size_t>(n));
    const size_t len = p.held.size();
    ForwardLocked(p, len >= kHoldBytes);
    // A partial line that began in these bytes is held from now.
    if (before == 0 || p.held.size() != len) p.held_since = std::chrono::steady_clock::now();
    if (p.keep_tail) {
      p.tail.append(buf, static_cast<size_t>(n));
      if (p.tail.size() > kTailBytes) p.tail.erase(0, p.tail.size() - kTailBytes);
    }
  }
}

int RankOutput::WaitMsLocked() const {
  std::optional<std::chrono::steady_clock::time_point> due;
  for (const auto& [key, p] : pipes_) {
    if (!p.held.empty() && (!due || p.held_since + kHoldFor < *due)) due = p.held_since + kHoldFor;
  }
  if (!due) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(*due - std::chrono::steady_clock::now()).count();
  return static_cast<int>(std::max<int64_t>(left, 0));
}

void RankOutput::Run() {
  std::vector<epoll_event> evs(32);
  int wait_ms = -1;
  for (;;) {
    int n = ::epoll_wait(epoll_.get(), evs.data(), static_cast<int>(evs.size()), wait_ms);
    if (n < 0 && errno == EINTR) continue;
    std::lock_guard<std::mutex> l(mu_);
    if (stop_ || n < 0) return;
    for (int i = 0; i < n; ++i) {
      int key = evs[i].data.fd;
      if (key == wake_.get()) continue;
      auto it = pipes_.find(key);
      if (it == pipes_.end() || DrainLocked(it->second)) continue;
      // EOF: every holder of the write end (the rank and its children) is
      // gone. A stderr tail stays readable while this is the rank's newest pipe.
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, key, nullptr);
      auto cur = current_.find(it->second.rank);
      if (it->second.keep_tail && cur != current_.end() && cur->second == key) {
        // Keep the entry (its tail) under a key no fd can have.
        const int rank = it->second.rank;
        it->second.fd.Reset();
        pipes_[-1 - rank] = std::move(it->second);
        cur->second = -1 - rank;
      }
      pipes_.erase(it);
    }
    // Partial lines held long enough go as they are.
    const auto now = std::chrono::steady_clock::now();
    for (auto& [key, p] : pipes_) {
      if (!p.held.empty() && now - p.held_since >= kHoldFor) ForwardLocked(p, true);
    }
    wait_ms = WaitMsLocked();
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
