// `ftrun export`: a persisted version as safetensors files. Layout, user
// bytes and exit codes: export_command.h.
#include "launcher/runner/export_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "plugin/common/file.h"
#include "plugin/common/log.h"
#include "plugin/common/progress.h"
#include "plugin/config/units.h"
#include "plugin/persist/disk_format.h"
#include "plugin/persist/env.h"
#include "plugin/persist/persist_reader.h"
#include "plugin/persist/version_scan.h"

namespace ftrun {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr char kUserBytesTensor[] = "__ftrun_user_bytes__";

const char* SafetensorsDType(DType d) {
  switch (d) {
    case DType::kUInt8:
      return "U8";
    case DType::kInt8:
      return "I8";
    case DType::kInt16:
      return "I16";
    case DType::kInt32:
      return "I32";
    case DType::kInt64:
      return "I64";
    case DType::kFloat16:
      return "F16";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat32:
      return "F32";
    case DType::kFloat64:
      return "F64";
    case DType::kBool:
      return "BOOL";
    case DType::kUInt16:
      return "U16";
    case DType::kUInt32:
      return "U32";
    case DType::kUInt64:
      return "U64";
  }
  return "U8";
}

// stat, not lstat: a persist or out dir may be a symlink to a directory.
bool IsDir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// "0,2,5-7" -> {0, 2, 5, 6, 7}, each in [0, world_size).
Status ParseRanks(const std::string& text, int world_size, std::vector<int>* out) {
  std::set<int> ranks;
  if (text.empty()) {
    for (int r = 0; r < world_size; ++r) ranks.insert(r);
  }
  size_t pos = 0;
  while (!text.empty() && pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    pos = comma + 1;
    long lo = -1, hi = -1;
    char extra = 0;
    const int n = std::sscanf(item.c_str(), "%ld-%ld%c", &lo, &hi, &extra);
    const bool single = n == 1 && item.find('-') == std::string::npos;
    if (item.empty() || !(single || n == 2) || item.find_first_not_of("0123456789-") != std::string::npos) {
      return Status::InvalidArgument("--ranks '" + text + "': '" + item +
                                     "' is not a rank or a range (expected e.g. 0,1 or 0-3)");
    }
    if (single) hi = lo;
    if (lo < 0 || hi < lo || hi >= world_size) {
      return Status::InvalidArgument("--ranks '" + text + "': '" + item + "' is not within ranks 0.." +
                                     std::to_string(world_size - 1) + " of this version's world size " +
                                     std::to_string(world_size));
    }
    for (long r = lo; r <= hi; ++r) ranks.insert(static_cast<int>(r));
  }
  out->assign(ranks.begin(), ranks.end());
  return Status::Ok();
}

// The out dir must be new or empty; it is created (with parents) if missing.
Status PrepareOut(Env* env, const std::string& out, bool* created) {
  *created = false;
  if (Exists(out)) {
    if (!IsDir(out)) {
      return Status::InvalidArgument("out dir '" + out + "' exists and is not a directory (expected a new or " +
                                     "empty directory)");
    }
    std::vector<std::string> names;
    FTRUN_RETURN_IF_ERROR(env->ListDir(out, &names));
    std::sort(names.begin(), names.end());
    if (!names.empty()) {
      return Status::InvalidArgument("out dir '" + out + "' is not empty (it holds " + NameListing(names) +
                                     "); expected a new or empty directory, so that an export never mixes with " +
                                     "other files");
    }
    return Status::Ok();
  }
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i] == '/' && !IsDir(out.substr(0, i))) FTRUN_RETURN_IF_ERROR(env->CreateDir(out.substr(0, i)));
  }
  return env->CreateDir(out, created);
}

// Writes the files of one export; Abort removes what it wrote.
class Exporter {
 public:
  Exporter(Env* env, const PersistReader& reader, std::string out, Progress* progress)
      : env_(env), reader_(reader), out_(std::move(out)), progress_(progress) {}

  Status WriteRank(const std::string& job, uint64_t version, int world_size, const Manifest& m, Json* entry);
  Status WriteIndex(const Json& index) {
    const std::string text = index.dump(2) + "\n";
    return WriteFile("index.json", [&](WritableFile* f) { return f->Append(text.data(), text.size()); });
  }
  void Abort(bool remove_dir) {
    for (const auto& p : written_) (void)env_->DeleteFile(p);
    if (remove_dir) (void)env_->DeleteDir(out_);
  }

 private:
  // name.tmp, filled by fill, synced, closed, renamed to name.
  template <typename Fill>
  Status WriteFile(const std::string& name, Fill fill) {
    const std::string path = out_ + "/" + name, tmp = path + ".tmp";
    std::unique_ptr<WritableFile> f;
    written_.push_back(tmp);
    FTRUN_RETURN_IF_ERROR(env_->NewWritableFile(tmp, &f));
    FTRUN_RETURN_IF_ERROR(fill(f.get()));
    FTRUN_RETURN_IF_ERROR(f->Sync());
    FTRUN_RETURN_IF_ERROR(f->Close());
    FTRUN_RETURN_IF_ERROR(env_->RenameFile(tmp, path));
    written_.back() = path;
    return env_->SyncDir(out_);
  }

  Env* const env_;
  const PersistReader& reader_;
  const std::string out_;
  Progress* const progress_;
  std::vector<std::string> written_;
};

Status Exporter::WriteRank(const std::string& job, uint64_t version, int world_size, const Manifest& m, Json* entry) {
  const std::string where = "version " + std::to_string(version) + " rank " + std::to_string(m.rank);
  Json header = Json::object();
  header["__metadata__"] = Json{{"format", "pt"},
                                {"ftrun.job", job},
                                {"ftrun.version", std::to_string(version)},
                                {"ftrun.rank", std::to_string(m.rank)},
                                {"ftrun.world_size", std::to_string(world_size)},
                                {"ftrun.user_bytes", kUserBytesTensor}};
  Json tensors = Json::array();
  uint64_t offset = 0;
  for (const auto& t : m.tensors) {
    if (t.info.name == kUserBytesTensor || t.info.name == "__metadata__") {
      return Status::FailedPrecondition(where + " has a tensor named '" + t.info.name +
                                        "', a name the safetensors export reserves");
    }
    Json& e = header[t.info.name];
    e["dtype"] = SafetensorsDType(t.info.dtype);
    e["shape"] = t.info.shape;
    e["data_offsets"] = Json::array({offset, offset + t.info.nbytes});
    offset += t.info.nbytes;
    tensors.push_back(Json{{"name", t.info.name},
                           {"dtype", DTypeName(t.info.dtype)},
                           {"shape", t.info.shape},
                           {"device", t.info.device == Device::kCuda ? "cuda" : "cpu"}});
  }
  Json& u = header[kUserBytesTensor];
  u["dtype"] = "U8";
  u["shape"] = Json::array({static_cast<uint64_t>(m.user_bytes.size())});
  u["data_offsets"] = Json::array({offset, offset + m.user_bytes.size()});
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {
    return Status::InvalidArgument(
        where + ": a tensor name cannot go into a safetensors JSON header (not UTF-8?): " + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);

  const std::string name = "rank" + std::to_string(m.rank) + ".safetensors";
  std::string buf;
  FTRUN_RETURN_IF_ERROR(WriteFile(name, [&](WritableFile* f) -> Status {
    FTRUN_RETURN_IF_ERROR(f->Append(len, sizeof(len)));
    FTRUN_RETURN_IF_ERROR(f->Append(text.data(), text.size()));
    for (const auto& t : m.tensors) {
      for (const auto& c : t.chunks) {
        if (buf.size() < c.length) buf.resize(c.length);
        Status st = reader_.ReadChunk(c, buf.data());  // checks the chunk's hash
        if (!st.ok()) return st.Annotate(where + " tensor '" + t.info.name + "'");
        FTRUN_RETURN_IF_ERROR(f->Append(buf.data(), c.length));
        progress_->Add(c.length);
      }
    }
    FTRUN_RETURN_IF_ERROR(f->Append(m.user_bytes.data(), m.user_bytes.size()));
    progress_->Add(m.user_bytes.size());
    return Status::Ok();
  }));
  *entry = Json{{"rank", m.rank},
                {"file", name},
                {"bytes", 8 + text.size() + offset + m.user_bytes.size()},
                {"user_bytes", m.user_bytes.size()},
                {"tensors", std::move(tensors)}};
  return Status::Ok();
}

int Fail(const Status& st, int code) {
  std::fprintf(stderr, "ftrun export: %s\n", st.message().c_str());
  return code;
}

}  // namespace

int RunExportCommand(int argc, char** argv) {
  CLI::App app{
      "ftrun export: a persisted version as one safetensors file per rank plus index.json, no agent "
      "needed (format: launcher/runner/export_command.h)"};
  app.name("ftrun export");
  std::string dir, job, out, ranks_arg;
  uint64_t version = 0;
  int world_size = 0;
  app.add_option("--persist-dir,--persist_dir", dir, "the job's persist.dir")->required();
  app.add_option("--job,--job-id,--job_id", job, "the job id (a directory under the persist dir)")->required();
  CLI::Option* version_opt =
      app.add_option("--version", version, "the version to export (default: the newest complete one)");
  app.add_option("--world-size,--world_size", world_size,
                 "the expected world size (default: the version's, from its COMPLETE markers)");
  app.add_option("--out", out, "a new or empty directory for the files")->required();
  app.add_option("--ranks", ranks_arg, "ranks to export, e.g. 0,1 or 0-3 (default: all)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  InitLogging("ftrun export", -1, -1, "warn");  // no info lines from the persist layer
  Env* env = PosixEnv();

  // Everything that can be wrong with the arguments is checked before a file is written.
  VersionScan scan;
  Status st = FindCompleteVersion(env, dir, job,
                                  version_opt->count() > 0 ? std::optional<uint64_t>(version) : std::nullopt, &scan);
  if (!st.ok()) return Fail(st, 2);
  if (world_size != 0 && world_size != scan.world_size) {
    return Fail(Status::InvalidArgument("version " + std::to_string(scan.version) + " of job '" + job + "' in '" + dir +
                                        "' was written with world size " + std::to_string(scan.world_size) +
                                        " (its COMPLETE markers say so), not " + std::to_string(world_size) +
                                        " (--world-size)"),
                2);
  }
  PersistReader reader(env, dir, job, scan.world_size);
  std::vector<Manifest> manifests;
  st = reader.LoadVersion(scan.version, nullptr, &manifests);
  if (!st.ok()) return Fail(st, 2);
  std::vector<int> ranks;
  st = ParseRanks(ranks_arg, scan.world_size, &ranks);
  if (!st.ok()) return Fail(st, 2);
  bool created = false;
  st = PrepareOut(env, out, &created);
  if (!st.ok()) return Fail(st, 2);

  uint64_t total = 0, tensors = 0;
  for (int r : ranks) total += manifests[r].state_bytes() + manifests[r].user_bytes.size();
  Progress progress("export", total, ::isatty(2) == 1);
  Exporter exporter(env, reader, out, &progress);
  Json index{{"format", "ftrun.export"}, {"format_version", 1},           {"job", job},
             {"version", scan.version},  {"world_size", scan.world_size}, {"user_bytes_tensor", kUserBytesTensor},
             {"ranks", Json::array()}};
  for (int r : ranks) {
    Json entry;
    st = exporter.WriteRank(job, scan.version, scan.world_size, manifests[r], &entry);
    if (!st.ok()) break;
    index["ranks"].push_back(std::move(entry));
    tensors += manifests[r].tensors.size();
  }
  if (st.ok()) st = exporter.WriteIndex(index);
  progress.End();
  if (!st.ok()) {
    exporter.Abort(created);
    return Fail(
        st.Annotate("exporting job '" + job + "' from '" + dir + "' to '" + out + "' failed (nothing left " + "there)"),
        1);
  }
  std::printf("exported version %llu of job '%s' (world size %d; %zu rank(s), %llu tensors, %s) to %s in %s (%s)\n",
              static_cast<unsigned long long>(scan.version), job.c_str(), scan.world_size, ranks.size(),
              static_cast<unsigned long long>(tensors), FormatSize(total).c_str(), out.c_str(),
              FormatSeconds(progress.elapsed()).c_str(), progress.rate().c_str());
  return 0;
}

}  // namespace ftrun
