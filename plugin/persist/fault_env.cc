// FaultEnv: crash, write-error and bit-flip injection over another Env.
#include "plugin/persist/fault_env.h"

#include <cstring>

#include "plugin/persist/disk_errors.h"

namespace ftrun {
namespace {

std::string Parent(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}
std::string Base(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

class FaultEnv::Writable : public WritableFile {
 public:
  Writable(FaultEnv* env, std::unique_ptr<WritableFile> base) : env_(env), base_(std::move(base)) {}

  Status Append(const void* data, size_t n) override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    FTRUN_RETURN_IF_ERROR(env_->LockedEnter("write", path()));
    size_t allowed = n;
    Status fault = env_->LockedWriteFault("write", path(), n, &allowed);
    if (allowed > 0) {
      FTRUN_RETURN_IF_ERROR(base_->Append(data, allowed));
      env_->files_[path()].size += allowed;
    }
    return fault;
  }
  Status Sync() override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    FTRUN_RETURN_IF_ERROR(env_->LockedEnter("sync", path()));
    size_t unused = 0;
    FTRUN_RETURN_IF_ERROR(env_->LockedWriteFault("sync", path(), 0, &unused));
    FTRUN_RETURN_IF_ERROR(base_->Sync());
    auto it = env_->files_.find(path());
    if (it != env_->files_.end()) it->second.synced = it->second.size;
    return Status::Ok();
  }
  Status Close() override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    Status st = env_->LockedEnter("close", path());
    Status closed = base_->Close();  // the fd goes either way
    return st.ok() ? closed : st;
  }
  WriteMode mode() const override { return base_->mode(); }
  const std::string& path() const override { return base_->path(); }

 private:
  FaultEnv* const env_;
  std::unique_ptr<WritableFile> base_;
};

class FaultEnv::Readable : public RandomAccessFile {
 public:
  Readable(const FaultEnv* env, std::unique_ptr<RandomAccessFile> base) : env_(env), base_(std::move(base)) {}
  Status Read(uint64_t offset, size_t n, void* dst, size_t* got) const override {
    {
      std::lock_guard<std::mutex> lock(env_->mu_);
      if (env_->read_faults_left_ > 0 && path().find(env_->read_fault_part_) != std::string::npos) {
        --env_->read_faults_left_;
        ++env_->failed_reads_;
        return DiskErrno("cannot read " + std::to_string(n) + " bytes at offset " + std::to_string(offset) + " of '" +
                             path() + "' (fault env)",
                         env_->read_err_);
      }
    }
    FTRUN_RETURN_IF_ERROR(base_->Read(offset, n, dst, got));
    std::lock_guard<std::mutex> lock(env_->mu_);
    auto it = env_->read_flips_.find(path());
    if (it == env_->read_flips_.end()) return Status::Ok();
    for (const auto& [at, bit] : it->second) {
      if (at >= offset && at < offset + *got) static_cast<char*>(dst)[at - offset] ^= static_cast<char>(1 << bit);
    }
    return Status::Ok();
  }
  uint64_t size() const override { return base_->size(); }
  const std::string& path() const override { return base_->path(); }

 private:
  const FaultEnv* const env_;
  std::unique_ptr<RandomAccessFile> base_;
};

Status FaultEnv::LockedEnter(const std::string& what, const std::string& path) {
  if (crashed_ || ops_ >= crash_at_) {
    crashed_ = true;
    return Status::IoError("cannot " + what + " '" + path + "': simulated crash (fault env)");
  }
  ++ops_;
  return Status::Ok();
}

Status FaultEnv::LockedWriteFault(const std::string& what, const std::string& path, size_t n, size_t* allowed) {
  *allowed = n;
  if (!fault_armed_) return Status::Ok();
  if (n > 0 && fault_budget_ >= n) {
    fault_budget_ -= n;
    return Status::Ok();
  }
  if (n > 0 && fault_budget_ > 0) {  // the budget ends inside this write
    *allowed = fault_budget_;
    fault_budget_ = 0;
  } else if (fault_budget_ > 0) {
    return Status::Ok();  // sync, create, rename: fail only once the bytes ran out
  }
  if (std::uniform_real_distribution<double>(0.0, 1.0)(rng_) >= fault_.probability) {
    *allowed = n;
    return Status::Ok();
  }
  ++failed_writes_;
  return Status::FromErrno("cannot " + what + " '" + path + "' (fault env)", fault_.err);
}

bool FaultEnv::LockedNameIsNew(const std::string& path) const {
  auto it = new_names_.find(Parent(path));
  return it != new_names_.end() && it->second.count(Base(path)) > 0;
}

void FaultEnv::LockedNewName(const std::string& path) { new_names_[Parent(path)].insert(Base(path)); }

// Keeps the durable bytes of `path` (its synced prefix, if it is being
// written) to put back on Crash, before a rename moves or replaces it.
void FaultEnv::LockedStash(const std::string& path) {
  if (LockedNameIsNew(path) || stash_.count(path) > 0) return;
  std::string bytes;
  if (!base_->ReadFile(path, &bytes).ok()) return;
  auto it = files_.find(path);
  if (it != files_.end() && bytes.size() > it->second.synced) bytes.resize(it->second.synced);
  stash_[path] = std::move(bytes);
}

void FaultEnv::LockedForget(const std::string& path) {
  files_.erase(path);
  stash_.erase(path);
  auto it = new_names_.find(Parent(path));
  if (it != new_names_.end()) it->second.erase(Base(path));
}

Status FaultEnv::NewWritableFile(const std::string& path, std::unique_ptr<WritableFile>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  FTRUN_RETURN_IF_ERROR(LockedEnter("create", path));
  size_t unused = 0;
  FTRUN_RETURN_IF_ERROR(LockedWriteFault("create", path, 0, &unused));
  bool existed = base_->FileExists(path);
  std::unique_ptr<WritableFile> base;
  FTRUN_RETURN_IF_ERROR(base_->NewWritableFile(path, &base));
  if (!existed) LockedNewName(path);
  files_[path] = FileState{};
  *out = std::make_unique<Writable>(this, std::move(base));
  return Status::Ok();
}

Status FaultEnv::NewRandomAccessFile(const std::string& path, std::unique_ptr<RandomAccessFile>* out) {
  std::unique_ptr<RandomAccessFile> base;
  FTRUN_RETURN_IF_ERROR(base_->NewRandomAccessFile(path, &base));
  *out = std::make_unique<Readable>(this, std::move(base));
  return Status::Ok();
}

Status FaultEnv::CreateDir(const std::string& path, bool* created) {
  std::lock_guard<std::mutex> lock(mu_);
  FTRUN_RETURN_IF_ERROR(LockedEnter("create directory", path));
  bool is_dir = false;
  size_t unused = 0;
  if (!base_->IsDirectory(path, &is_dir).ok() || !is_dir) {  // an existing one needs no space
    FTRUN_RETURN_IF_ERROR(LockedWriteFault("create directory", path, 0, &unused));
  }
  bool made = false;
  FTRUN_RETURN_IF_ERROR(base_->CreateDir(path, &made));
  if (made) LockedNewName(path);
  if (created != nullptr) *created = made;
  return Status::Ok();
}

Status FaultEnv::SyncDir(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  FTRUN_RETURN_IF_ERROR(LockedEnter("sync directory", path));
  FTRUN_RETURN_IF_ERROR(base_->SyncDir(path));
  new_names_.erase(path);
  for (auto it = stash_.begin(); it != stash_.end();) {
    it = Parent(it->first) == path ? stash_.erase(it) : std::next(it);
  }
  return Status::Ok();
}

Status FaultEnv::RenameFile(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lock(mu_);
  FTRUN_RETURN_IF_ERROR(LockedEnter("rename", from));
  size_t unused = 0;
  FTRUN_RETURN_IF_ERROR(LockedWriteFault("rename", from, 0, &unused));
  if (base_->FileExists(to)) LockedStash(to);
  LockedStash(from);
  FTRUN_RETURN_IF_ERROR(base_->RenameFile(from, to));
  auto it = new_names_.find(Parent(from));
  if (it != new_names_.end()) it->second.erase(Base(from));
  LockedNewName(to);
  files_.erase(to);
  auto f = files_.find(from);
  if (f != files_.end()) {
    files_[to] = f->second;
    files_.erase(f);
  }
  return Status::Ok();
}

Status FaultEnv::DeleteFile(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  FTRUN_RETURN_IF_ERROR(LockedEnter("delete", path));
  FTRUN_RETURN_IF_ERROR(base_->DeleteFile(path));
  LockedForget(path);
  return Status::Ok();
}

Status FaultEnv::DeleteDir(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  FTRUN_RETURN_IF_ERROR(LockedEnter("delete directory", path));
  FTRUN_RETURN_IF_ERROR(base_->DeleteDir(path));
  LockedForget(path);
  new_names_.erase(path);
  return Status::Ok();
}

Status FaultEnv::ListDir(const std::string& path, std::vector<std::string>* names) {
  return base_->ListDir(path, names);
}
Status FaultEnv::GetFileSize(const std::string& path, uint64_t* size) { return base_->GetFileSize(path, size); }
Status FaultEnv::IsDirectory(const std::string& path, bool* is_dir) { return base_->IsDirectory(path, is_dir); }
Status FaultEnv::FreeSpace(const std::string& path, uint64_t* bytes) { return base_->FreeSpace(path, bytes); }

void FaultEnv::CrashAfter(uint64_t ops) {
  std::lock_guard<std::mutex> lock(mu_);
  crash_at_ = ops_ + ops;
}

uint64_t FaultEnv::ops() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_;
}

bool FaultEnv::crashed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return crashed_;
}

Status FaultEnv::LockedTruncate(const std::string& path, uint64_t size) {
  std::string bytes;
  FTRUN_RETURN_IF_ERROR(base_->ReadFile(path, &bytes));
  if (bytes.size() <= size) return Status::Ok();
  std::unique_ptr<WritableFile> f;
  FTRUN_RETURN_IF_ERROR(base_->NewWritableFile(path, &f));
  FTRUN_RETURN_IF_ERROR(f->Append(bytes.data(), size));
  FTRUN_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

Status FaultEnv::Crash() {
  std::lock_guard<std::mutex> lock(mu_);
  // 1. Names not made durable go, with whatever they hold (deepest first).
  for (auto d = new_names_.rbegin(); d != new_names_.rend(); ++d) {
    for (const auto& name : d->second) FTRUN_RETURN_IF_ERROR(DeleteTree(base_, d->first + "/" + name));
  }
  // 2. Files that keep their names lose their unsynced bytes.
  for (const auto& [path, state] : files_) {
    if (base_->FileExists(path)) FTRUN_RETURN_IF_ERROR(LockedTruncate(path, state.synced));
  }
  // 3. Durable names that a rename moved or replaced come back.
  for (const auto& [path, bytes] : stash_) {
    bool is_dir = false;
    if (!base_->IsDirectory(Parent(path), &is_dir).ok() || !is_dir) continue;
    std::unique_ptr<WritableFile> f;
    FTRUN_RETURN_IF_ERROR(base_->NewWritableFile(path, &f));
    FTRUN_RETURN_IF_ERROR(f->Append(bytes.data(), bytes.size()));
    FTRUN_RETURN_IF_ERROR(f->Sync());
    FTRUN_RETURN_IF_ERROR(f->Close());
  }
  files_.clear();
  new_names_.clear();
  stash_.clear();
  crashed_ = false;
  crash_at_ = UINT64_MAX;
  return Status::Ok();
}

void FaultEnv::FailWrites(const WriteFault& fault) {
  std::lock_guard<std::mutex> lock(mu_);
  fault_armed_ = true;
  fault_ = fault;
  fault_budget_ = fault.after_bytes;
  rng_.seed(fault.seed);
}

void FaultEnv::ClearWriteFaults() {
  std::lock_guard<std::mutex> lock(mu_);
  fault_armed_ = false;
}

uint64_t FaultEnv::failed_writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_writes_;
}

void FaultEnv::FailReads(int err, uint64_t count, std::string path_part) {
  std::lock_guard<std::mutex> lock(mu_);
  read_err_ = err;
  read_faults_left_ = count;
  read_fault_part_ = std::move(path_part);
}

uint64_t FaultEnv::failed_reads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_reads_;
}

void FaultEnv::FlipBitOnRead(const std::string& path, uint64_t offset, int bit) {
  std::lock_guard<std::mutex> lock(mu_);
  read_flips_[path].emplace_back(offset, bit & 7);
}

void FaultEnv::ClearReadFlips() {
  std::lock_guard<std::mutex> lock(mu_);
  read_flips_.clear();
}

Status FaultEnv::FlipBitOnDisk(const std::string& path, uint64_t offset, int bit) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string bytes;
  FTRUN_RETURN_IF_ERROR(base_->ReadFile(path, &bytes));
  if (offset >= bytes.size()) {
    return Status::InvalidArgument("cannot flip a bit at offset " + std::to_string(offset) + " of '" + path +
                                   "': it has " + std::to_string(bytes.size()) + " bytes");
  }
  bytes[offset] ^= static_cast<char>(1 << (bit & 7));
  std::unique_ptr<WritableFile> f;
  FTRUN_RETURN_IF_ERROR(base_->NewWritableFile(path, &f));
  FTRUN_RETURN_IF_ERROR(f->Append(bytes.data(), bytes.size()));
  FTRUN_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

}  // namespace ftrun
