// _ftrun: the Python binding of ftrun::Client (include/ftrun/client.h).
//
// Threading: every call that can block releases the GIL. A per-object mutex,
// taken only while the GIL is released (so the two locks never wait on each
// other), serializes calls as Client requires. Python objects (buffers,
// arrays, dicts) are only touched with the GIL held: buffer info is
// collected before the GIL is released, errors are raised after it is back.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ftrun/client.h"
#include "ftrun/status.h"
#include "plugin/python/buffers.h"
#include "plugin/python/errors.h"
#include "plugin/python/module_docs.h"
#include "plugin/python/module_parts.h"
#include "plugin/python/save_refs.h"

namespace py = pybind11;

namespace {

using ftrun::Code;
using ftrun::DType;
using ftrun::Status;

using ftrun::python::Raise;

// The load result type; created once at import and kept for the life of the
// process.
PyTypeObject* g_load_result = nullptr;

void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}

class PyClient {
 public:
  PyClient(const std::string& socket_path, int rank, int connect_timeout_ms, bool writer) {
    ftrun::ClientOptions options{socket_path, rank, connect_timeout_ms, writer};
    std::unique_ptr<ftrun::Client> client;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = ftrun::Client::Connect(options, &client);
    }
    Check(st);
    client_ = std::move(client);
  }

  // Runs f(Client&) without the GIL, holding mu_. Raises if closed.
  template <typename F>
  auto Call(F&& f) {
    using R = std::invoke_result_t<F, ftrun::Client&>;
    std::optional<R> result;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      if (client_) result.emplace(f(*client_));
    }
    if (!result) Raise(Status::FailedPrecondition("the ftrun client is closed"));
    return std::move(*result);
  }

  int rank() {
    return Call([](ftrun::Client& c) { return c.rank(); });
  }
  std::string job_id() {
    return Call([](ftrun::Client& c) { return c.job_id(); });
  }
  uint64_t chunk_size() {
    return Call([](ftrun::Client& c) { return c.chunk_size(); });
  }

  py::object restore_version() {
    uint64_t v = 0;
    bool has = Call([&](ftrun::Client& c) { return c.restore_version(&v); });
    return has ? py::object(py::int_(v)) : py::object(py::none());
  }

  py::dict Save(uint64_t version, const py::dict& tensors, const py::bytes& user_bytes, const py::object& generations,
                const py::object& dtypes, uintptr_t cuda_stream, bool order_cuda_stream,
                const py::object& same_buffers) {
    // Buffers stay held (and are released with the GIL) until we return.
    std::vector<py::buffer_info> buffers;
    std::vector<ftrun::TensorRef> refs =
        ftrun::python::ToTensorRefs(tensors, generations, dtypes, &buffers, same_buffers, &last_refs_);
    std::string_view user(PyBytes_AS_STRING(user_bytes.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(user_bytes.ptr())));
    DetachMapped();
    ftrun::SaveStats stats;
    ftrun::SaveOptions options;
    options.cuda_stream = reinterpret_cast<void*>(cuda_stream);
    options.order_cuda_stream = order_cuda_stream;
    Check(Call([&](ftrun::Client& c) { return c.Save(version, refs, user, options, &stats); }));
    return ftrun::python::StatsToDict(stats);
  }

  void Wait() {
    Check(Call([](ftrun::Client& c) { return c.Wait(); }));
  }

  void OrderAfterSave(uintptr_t cuda_stream) {
    Check(Call([&](ftrun::Client& c) { return c.OrderAfterSave(reinterpret_cast<void*>(cuda_stream)); }));
  }

  void WaitCommitted(uint64_t version, int timeout_ms) {
    Check(Call([&](ftrun::Client& c) { return c.WaitCommitted(version, timeout_ms); }));
  }

  void ReportProgress(uint64_t step) {
    Check(Call([&](ftrun::Client& c) { return c.ReportProgress(step); }));
  }

  py::dict ListVersions() {
    ftrun::VersionList list;
    Check(Call([&](ftrun::Client& c) { return c.ListVersions(&list); }));
    py::dict d;
    d["committed"] = ftrun::python::ToList(list.committed);
    d["pending"] = ftrun::python::ToList(list.pending);
    d["restore"] = list.has_restore ? py::object(py::int_(list.restore_version)) : py::object(py::none());
    return d;
  }

  py::object Load(const py::object& version_arg, bool map, const py::object& cuda, uintptr_t cuda_stream,
                  const py::object& into);

  void Close() {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    client_.reset();  // An open snapshot keeps its own reference.
  }

 private:
  ftrun::python::LastRefs last_refs_;  // Save(same_buffers=...)

  // Keeps a loaded snapshot (and, through `client`, its connection) alive,
  // and destroys both without the GIL and under mu_, also when unwinding.
  // (Mapped arrays may outlive the PyClient: the mutex is shared.)
  struct OpenSnapshot {
    std::shared_ptr<std::mutex> mu;
    std::shared_ptr<ftrun::Client> client;
    std::unique_ptr<ftrun::Snapshot> snap;
    ~OpenSnapshot() {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(*mu);
      snap.reset();
      client.reset();
    }
  };

  // A loaded tensor mapped copy-on-write from the store (load(map=True)):
  // the base of its numpy array. Its snapshot stays open (the version
  // pinned) until the mapping is detached or the array is freed.
  struct Mapped {
    std::shared_ptr<OpenSnapshot> open;  // declared first: closed after the unmap
    std::unique_ptr<ftrun::MappedTensor> tensor;
  };

  // Before a save: a newer committed version lets the store reuse the
  // extents of the loaded one, so every mapped tensor still alive gets
  // private pages first and its snapshot closes. Nothing to do once the
  // loaded arrays are freed (the usual case: load_state_dict copied them).
  void DetachMapped() {
    std::vector<std::shared_ptr<Mapped>> live;
    for (auto& w : mapped_) {
      if (auto m = w.lock()) live.push_back(std::move(m));
    }
    mapped_.clear();
    if (live.empty()) return;
    Status st;
    {
      py::gil_scoped_release nogil;
      for (auto& m : live) {
        Status s = m->tensor->Detach();
        if (st.ok()) st = s;
      }
    }
    for (auto& m : live) {
      if (m->tensor->detached())
        m->open.reset();  // closes the snapshot once the last goes
      else
        mapped_.push_back(m);
    }
    live.clear();
    Check(st);
  }

  std::shared_ptr<std::mutex> mu_ptr_ = std::make_shared<std::mutex>();
  std::mutex& mu_ = *mu_ptr_;
  // Guarded by mu_. shared: an open snapshot must not outlive its client.
  std::shared_ptr<ftrun::Client> client_;
  // Guarded by the GIL: the mapped tensors handed out by load(map=True).
  std::vector<std::weak_ptr<Mapped>> mapped_;
};

py::object PyClient::Load(const py::object& version_arg, bool map, const py::object& cuda, uintptr_t cuda_stream,
                          const py::object& into) {
  const uint64_t version = version_arg.is_none() ? ftrun::Client::kLatest : version_arg.cast<uint64_t>();
  last_refs_.by_name.clear();  // (a load replaces the state: the last save's objects are not held past it)
  auto open = std::make_shared<OpenSnapshot>();
  open->mu = mu_ptr_;
  Check(Call([&](ftrun::Client& c) {
    open->client = client_;
    return c.Load(version, &open->snap);
  }));

  // Tensors named in `cuda` or `into` (dicts, or callables given the
  // version's user bytes that return one) go straight to that CUDA or host
  // memory. The others are mapped (map=True, 64 KiB or more) or read,
  // without the GIL, into arrays built with it (those that cannot be mapped
  // are read into arrays allocated first).
  constexpr uint64_t kMapMinBytes = 64 << 10;
  const std::vector<ftrun::TensorInfo>& infos = open->snap->tensors();
  const std::string& user_bytes = open->snap->user_bytes();
  py::object cuda_targets = ftrun::python::ResolveTargets(cuda, user_bytes);
  py::object host_targets = ftrun::python::ResolveTargets(into, user_bytes);
  std::vector<py::buffer_info> host_views;
  std::vector<ftrun::TensorRef> device_dsts = ftrun::python::CudaTargets(infos, cuda_targets);
  std::vector<ftrun::TensorRef> host_dsts = ftrun::python::HostTargets(infos, host_targets, &host_views);
  std::vector<bool> to_device(infos.size()), given(infos.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    to_device[i] = device_dsts[i].device == ftrun::Device::kCuda;
    given[i] = to_device[i] || host_dsts[i].data != nullptr;
    if (to_device[i] && host_dsts[i].data != nullptr)
      throw py::value_error("cuda and into both name '" + infos[i].name + "'");
  }
  std::vector<std::unique_ptr<ftrun::MappedTensor>> maps(infos.size());
  Status st;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < infos.size() && st.ok(); ++i) {
      if (to_device[i]) {
        st = open->snap->ReadToDevice(infos[i].name, const_cast<void*>(device_dsts[i].data), infos[i].nbytes,
                                      reinterpret_cast<void*>(cuda_stream));
      } else if (given[i]) {
        st = open->snap->Refresh(infos[i].name, const_cast<void*>(host_dsts[i].data), infos[i].nbytes);
      }
    }
  }
  Check(st);
  if (map) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < infos.size() && st.ok(); ++i) {
      if (infos[i].nbytes < kMapMinBytes || given[i]) continue;
      st = open->snap->Map(infos[i].name, &maps[i]);
      if (st.code() == Code::kFailedPrecondition) st = Status::Ok();  // read below
    }
  }
  Check(st);
  mapped_.erase(std::remove_if(mapped_.begin(), mapped_.end(), [](const auto& w) { return w.expired(); }),
                mapped_.end());
  py::dict arrays, dtypes, devices;
  std::vector<std::pair<size_t, py::array>> to_read;
  std::vector<void*> dsts;  // to_read's, taken with the GIL
  for (size_t i = 0; i < infos.size(); ++i) {
    const ftrun::TensorInfo& t = infos[i];
    std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
    devices[t.name.c_str()] = t.device == ftrun::Device::kCuda ? "cuda" : "cpu";
    dtypes[t.name.c_str()] = ftrun::DTypeName(t.dtype);
    if (given[i]) {
      arrays[t.name.c_str()] =
          py::reinterpret_borrow<py::dict>(to_device[i] ? cuda_targets : host_targets)[t.name.c_str()];
      continue;
    }
    py::array a;
    if (maps[i]) {
      void* data = maps[i]->data();
      auto* m = new std::shared_ptr<Mapped>(new Mapped{open, std::move(maps[i])});
      mapped_.push_back(*m);
      py::capsule base(m, [](void* p) { delete static_cast<std::shared_ptr<Mapped>*>(p); });
      a = ftrun::python::NewArray(t.dtype, shape, data, base);
    } else {
      a = ftrun::python::NewArray(t.dtype, shape);
      to_read.emplace_back(i, a);
      dsts.push_back(a.mutable_data());
    }
    arrays[t.name.c_str()] = a;
  }
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t k = 0; k < to_read.size() && st.ok(); ++k) {
      st = open->snap->Read(infos[to_read[k].first].name, dsts[k], infos[to_read[k].first].nbytes);
    }
  }
  Check(st);

  py::object result = py::reinterpret_steal<py::object>(PyStructSequence_New(g_load_result));
  if (!result) throw py::error_already_set();
  PyStructSequence_SetItem(result.ptr(), 0, py::int_(open->snap->version()).release().ptr());
  PyStructSequence_SetItem(result.ptr(), 1, arrays.release().ptr());
  PyStructSequence_SetItem(result.ptr(), 2, py::bytes(open->snap->user_bytes()).release().ptr());
  PyStructSequence_SetItem(result.ptr(), 3, dtypes.release().ptr());
  PyStructSequence_SetItem(result.ptr(), 4, devices.release().ptr());
  return result;
}

PyStructSequence_Field g_load_result_fields[] = {
    {"version", "the loaded version"},
    {"tensors", "dict: name -> numpy.ndarray (bfloat16 as uint16), or the CUDA memory given in cuda="},
    {"user_bytes", "bytes given to save"},
    {"dtypes", "dict: name -> saved dtype name ('float32', 'bfloat16', ...)"},
    {"devices", "dict: name -> device saved from ('cpu' or 'cuda')"},
    {nullptr, nullptr},
};

PyStructSequence_Desc g_load_result_desc = {
    "_ftrun.LoadResult",
    "Result of Client.load. Unpacks as (version, tensors, user_bytes); the\n"
    "fields dtypes and devices are reachable by name only.",
    g_load_result_fields,
    3,
};

}  // namespace

PYBIND11_MODULE(_ftrun, m) {
  m.doc() = ftrun::python::kModuleDoc;

  ftrun::python::RegisterErrors(m);
  g_load_result = PyStructSequence_NewType(&g_load_result_desc);
  if (g_load_result == nullptr) throw py::error_already_set();
  m.add_object("LoadResult", py::handle(reinterpret_cast<PyObject*>(g_load_result)));
  m.attr("LATEST") = py::int_(ftrun::Client::kLatest);
#ifdef FTRUN_HAVE_CUDA
  m.attr("CUDA") = true;  // libftrun has the CUDA save path
#else
  m.attr("CUDA") = false;
#endif

  py::class_<PyClient>(m, "Client",
                       "A rank's connection to its node agent. Use as a context manager or "
                       "call close(); calls after close raise Error (FAILED_PRECONDITION).")
      .def(py::init<const std::string&, int, int, bool>(), py::arg("socket_path") = "", py::arg("rank") = -1,
           py::arg("connect_timeout_ms") = 10000, py::arg("writer") = false,
           "Connects to the agent. socket_path '': $FTRUN_AGENT_SOCKET; rank -1: "
           "$FTRUN_RANK, else $RANK. writer: a process of the rank's process group that saves for it "
           "beside the rank's own connection (DCP's process checkpointer): save and list_versions only.")
      .def_property_readonly("rank", &PyClient::rank)
      .def_property_readonly("job_id", &PyClient::job_id)
      .def_property_readonly("chunk_size", &PyClient::chunk_size)
      .def_property_readonly("restore_version", &PyClient::restore_version,
                             "The version to restore after a restart, or None at a fresh start.")
      .def("save", &PyClient::Save, py::arg("version"), py::arg("tensors"), py::arg("user_bytes") = py::bytes(""),
           py::arg("generations") = py::none(), py::arg("dtypes") = py::none(), py::arg("cuda_stream") = 0,
           py::arg("order_cuda_stream") = true, py::arg("same_buffers") = py::none(), ftrun::python::kSaveDoc)
      .def("wait", &PyClient::Wait, "Completes the last save's asynchronous part.")
      .def("order_after_save", &PyClient::OrderAfterSave, py::arg("cuda_stream") = 0,
           "Makes the CUDA stream's later work wait for the last save's copies (no CPU wait); a no-op when "
           "none are in flight.")
      .def("wait_committed", &PyClient::WaitCommitted, py::arg("version"), py::arg("timeout_ms") = 60000,
           "Blocks until `version` (or a newer one) is committed; Error TIMEOUT after "
           "timeout_ms.")
      .def("load", &PyClient::Load, py::arg("version") = py::none(), py::arg("map") = false,
           py::arg("cuda") = py::none(), py::arg("cuda_stream") = 0, py::arg("into") = py::none(),
           ftrun::python::kLoadDoc)
      .def("list_versions", &PyClient::ListVersions,
           "dict(committed=[...ascending], pending=[this rank's uncommitted], "
           "restore=int or None)")
      .def("report_progress", &PyClient::ReportProgress, py::arg("step"),
           "Tells the agent this rank is alive and at `step`.")
      .def("close", &PyClient::Close, "Disconnects; idempotent.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& self, py::args) { self.Close(); });

  ftrun::python::RegisterPersist(m);
  ftrun::python::RegisterStateWalk(m);
  ftrun::python::RegisterWarm(m);
}
