// _ftrun.read_persisted / _ftrun.list_persisted: a job's versions in its
// persist directory, read without any agent (plugin/persist/persist_reader.h).
// ftrun.load_persisted (integration/python/ftrun/persisted.py) builds the
// torch state from them.
//
// Threading: scanning the directory and reading chunks run with the GIL
// released; numpy arrays are allocated before (GIL held) and filled without
// it. Every chunk's hash is checked; an error raises _ftrun.Error with .code
// ('NOT_FOUND', 'CORRUPTION', 'FAILED_PRECONDITION', ...) and a message that
// names the file, or InvalidArgumentError for a rank outside the world size.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ftrun/client.h"
#include "ftrun/status.h"
#include "plugin/persist/disk_format.h"
#include "plugin/persist/env.h"
#include "plugin/persist/persist_reader.h"
#include "plugin/persist/version_scan.h"
#include "plugin/python/buffers.h"
#include "plugin/python/errors.h"
#include "plugin/python/module_parts.h"

namespace py = pybind11;

namespace ftrun::python {
namespace {

// The module's result type, looked up at registration and kept for the life
// of the process (as module.cc keeps it).
PyObject* g_load_result = nullptr;

bool IsDir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

struct Found {
  uint64_t version = 0;
  int world_size = 0;
  std::vector<Manifest> manifests;
};

// The version to read (`want`, or the newest complete one) and its manifests.
Status FindVersion(const std::string& dir, const std::string& job, bool has_version, uint64_t want, int world_size,
                   Found* out) {
  Env* env = PosixEnv();
  VersionScan scan;
  FTRUN_RETURN_IF_ERROR(
      FindCompleteVersion(env, dir, job, has_version ? std::optional<uint64_t>(want) : std::nullopt, &scan));
  if (world_size > 0 && world_size != scan.world_size) {
    return Status::FailedPrecondition("version " + std::to_string(scan.version) + " of job '" + job +
                                      "' was written with world size " + std::to_string(scan.world_size) + ", not " +
                                      std::to_string(world_size));
  }
  out->version = scan.version;
  out->world_size = scan.world_size;
  return PersistReader(env, dir, job, scan.world_size).LoadVersion(scan.version, nullptr, &out->manifests);
}

py::object ReadPersisted(const std::string& dir, const std::string& job, const py::object& version_arg, int rank,
                         const py::object& world_size_arg) {
  const bool has_version = !version_arg.is_none();
  uint64_t want = 0;
  int world_size = 0;
  try {
    if (has_version) want = version_arg.cast<uint64_t>();
    if (!world_size_arg.is_none()) world_size = world_size_arg.cast<int>();
  } catch (const py::cast_error&) {
    throw py::value_error("version and world_size must be non-negative ints or None");
  }
  Found found;
  Status st;
  {
    py::gil_scoped_release nogil;
    st = FindVersion(dir, job, has_version, want, world_size, &found);
  }
  if (!st.ok()) Raise(st);
  if (rank < 0 || rank >= found.world_size) {
    Raise(Status::InvalidArgument("rank " + std::to_string(rank) + " is outside ranks 0.." +
                                  std::to_string(found.world_size - 1) + " of version " +
                                  std::to_string(found.version) + " of job '" + job + "'"));
  }
  const Manifest& m = found.manifests[static_cast<size_t>(rank)];

  // Allocate every array with the GIL, then fill them all without it.
  py::dict arrays, dtypes, devices;
  std::vector<std::pair<char*, uint64_t>> dsts;
  for (const auto& t : m.tensors) {
    std::vector<py::ssize_t> shape(t.info.shape.begin(), t.info.shape.end());
    py::array a = NewArray(t.info.dtype, shape);
    dsts.emplace_back(static_cast<char*>(a.mutable_data()), static_cast<uint64_t>(a.nbytes()));
    arrays[t.info.name.c_str()] = a;
    dtypes[t.info.name.c_str()] = DTypeName(t.info.dtype);
    devices[t.info.name.c_str()] = t.info.device == Device::kCuda ? "cuda" : "cpu";
  }
  {
    py::gil_scoped_release nogil;
    PersistReader reader(PosixEnv(), dir, job, found.world_size);
    for (size_t i = 0; i < m.tensors.size() && st.ok(); ++i) {
      const TensorManifest& t = m.tensors[i];
      uint64_t off = 0;
      for (const auto& c : t.chunks) {
        if (off + c.length > dsts[i].second) {
          st = Status::Corruption("its chunks hold more than its " + std::to_string(dsts[i].second) + " bytes");
        } else {
          st = reader.ReadChunk(c, dsts[i].first + off);
        }
        if (!st.ok()) {
          st = st.Annotate("persist dir '" + dir + "': version " + std::to_string(found.version) + " rank " +
                           std::to_string(rank) + " tensor '" + t.info.name + "'");
          break;
        }
        off += c.length;
      }
    }
  }
  if (!st.ok()) Raise(st);
  return py::reinterpret_borrow<py::object>(g_load_result)(
      py::make_tuple(found.version, arrays, py::bytes(m.user_bytes), dtypes, devices));
}

py::list ListPersisted(const std::string& dir, const std::string& job) {
  std::vector<VersionScan> scans;
  Status st;
  {
    py::gil_scoped_release nogil;
    if (!IsDir(dir)) {
      st = Status::NotFound("persist dir '" + dir + "' does not exist or is not a directory");
    } else {
      st = PersistReader(PosixEnv(), dir, job, 0).Scan(&scans);
    }
  }
  if (!st.ok()) Raise(st);
  py::list out;
  for (const auto& s : scans) {
    py::dict d;
    d["version"] = s.version;
    d["complete"] = s.complete;
    d["reason"] = s.reason;
    d["job"] = s.job_id;
    d["world_size"] = s.world_size;
    out.append(d);
  }
  return out;
}

constexpr const char kReadDoc[] = R"doc(
Reads one rank of a version from a persist directory (persist.dir), without
any agent: returns a LoadResult like Client.load, which unpacks as

    version, tensors, user_bytes = _ftrun.read_persisted(dir, job)

version None: the newest complete version; world_size None: the version's
own (from its COMPLETE markers), else it must match. Every chunk's hash is
checked. tensors are numpy arrays (bfloat16 as uint16; .dtypes says which),
.devices says where each was saved from. Raises Error: NOT_FOUND (no such
dir, job or version, or nothing complete), FAILED_PRECONDITION (the version is
not complete, or another world size), CORRUPTION or NOT_FOUND naming a chunk
file that is corrupt or missing; InvalidArgumentError for a rank outside the
world size.
)doc";

}  // namespace

// Called from module.cc's PYBIND11_MODULE, after Error, InvalidArgumentError
// and LoadResult are in the module.
void RegisterPersist(py::module_& m) {
  g_load_result = py::object(m.attr("LoadResult")).release().ptr();
  m.def("read_persisted", &ReadPersisted, py::arg("dir"), py::arg("job"), py::arg("version") = py::none(),
        py::arg("rank") = 0, py::arg("world_size") = py::none(), kReadDoc);
  m.def("list_persisted", &ListPersisted, py::arg("dir"), py::arg("job"),
        "The job's version directories in a persist dir, newest first: a list of dicts (version, complete, "
        "reason why not, job and world_size from its markers). Error NOT_FOUND when dir does not exist; [] "
        "when the job has none.");
}

}  // namespace ftrun::python
