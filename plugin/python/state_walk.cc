// What a save does for every object of its state, in C++: a save walks its
// whole state every time to find out whether anything changed since the
// last one (ftrun.state_reuse), and between two training steps the state's
// Python objects are cold.
//
// flatten(obj, root, kinds) -> (trace, tensors, where, atoms, objects, object_where)
//   ftrun.state_flat's walk; see ftrun/state_flat.py for what each is; kinds
//   is the tuple state_flat._KINDS: (Tensor, Parameter, torch.Tensor for
//   isinstance, OrderedDict, defaultdict, ATOM token, OBJECT token, dict
//   tag, sequence tag, root segment, Unflattenable).
// signatures(tensors) -> [(type, dtype, shape, device, layout, requires_grad), ...]
// reusable(tensors, signatures, views, complex_dtypes) -> None | (buffers, fresh)
//   None when a tensor's signature differs; else buffers[k] is view k's
//   buffer when tensor k is still at that view's address with its strides
//   and no lazy conjugate or negative bit, else None; fresh lists
//   (k, address) of the tensors whose buffer must be made again.
#include <pybind11/pybind11.h>

#include <string>
#include <unordered_map>
#include <unordered_set>

#include "plugin/python/module_parts.h"

namespace py = pybind11;

namespace ftrun::python {
namespace {

bool IsAtomType(PyTypeObject* t) {
  return t == &PyLong_Type || t == &PyFloat_Type || t == &PyBool_Type || t == &PyUnicode_Type || t == &PyBytes_Type ||
         t == &PyComplex_Type || t == Py_TYPE(Py_None);
}

// Whether every item of a list or tuple is an atom (it is then one atom itself).
bool AllAtoms(PyObject* seq) {
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!IsAtomType(Py_TYPE(items[i]))) return false;
  }
  return true;
}

class Walk {
 public:
  explicit Walk(const py::tuple& kinds)
      : tensor_(kinds[0]),
        param_(kinds[1]),
        tensor_base_(kinds[2]),
        odict_(kinds[3]),
        ddict_(kinds[4]),
        atom_(kinds[5]),
        object_(kinds[6]),
        dict_tag_(kinds[7]),
        seq_tag_(kinds[8]),
        root_seg_(kinds[9]),
        unflattenable_(kinds[10]) {}

  py::tuple Run(py::handle obj, py::handle root) {
    PyTypeObject* t = Py_TYPE(obj.ptr());
    if (IsPlainTensor(t) || IsAtomType(t)) {
      Child(obj, root, root_seg_);
    } else {
      Visit(obj, py::make_tuple(root, root_seg_));
    }
    return py::make_tuple(trace_, tensors_, where_, atoms_, objects_, object_where_);
  }

 private:
  bool IsPlainTensor(PyTypeObject* t) const {
    return reinterpret_cast<PyObject*>(t) == tensor_.ptr() || reinterpret_cast<PyObject*>(t) == param_.ptr();
  }

  // A leaf or container reached from the container at `at` through `seg`.
  void Child(py::handle c, py::handle at, py::handle seg) {
    PyTypeObject* ct = Py_TYPE(c.ptr());
    if (IsPlainTensor(ct)) {
      auto [it, fresh] = index_.try_emplace(c.ptr(), static_cast<Py_ssize_t>(index_.size()));
      if (fresh) {
        tensors_.append(c);
        where_.append(py::make_tuple(at, seg));
      }
      trace_.append(py::int_(it->second));
    } else if (IsAtomType(ct)) {
      atoms_.append(c);
      trace_.append(atom_);
    } else {
      Visit(c, py::make_tuple(at, seg));
    }
  }

  void Enter(py::handle v) {
    if (!entered_.insert(v.ptr()).second) {
      PyErr_SetString(unflattenable_.ptr(),
                      (std::string("a ") + Py_TYPE(v.ptr())->tp_name + " is reached twice").c_str());
      throw py::error_already_set();
    }
  }

  void Visit(py::handle v, const py::tuple& at) {
    if (Py_EnterRecursiveCall(" while flattening a state for ftrun.save") != 0) throw py::error_already_set();
    struct Leave {
      ~Leave() { Py_LeaveRecursiveCall(); }
    } leave;
    PyObject* t = reinterpret_cast<PyObject*>(Py_TYPE(v.ptr()));
    if (t == reinterpret_cast<PyObject*>(&PyDict_Type) || t == odict_.ptr() || t == ddict_.ptr()) {
      if (VisitDict(v, at)) return;
    } else if (PyList_CheckExact(v.ptr()) || PyTuple_CheckExact(v.ptr())) {
      VisitSequence(v, at, py::none());
      return;
    } else if (PyTuple_Check(v.ptr()) && py::hasattr(t, "_fields") && py::hasattr(t, "_make")) {
      VisitSequence(v, at, py::handle(t).attr("_fields"));
      return;
    }
    // Anything else is an object leaf, pickled as it is.
    const int is_tensor = PyObject_IsInstance(v.ptr(), tensor_base_.ptr());
    if (is_tensor < 0) throw py::error_already_set();
    if (is_tensor) object_where_[py::int_(reinterpret_cast<uintptr_t>(v.ptr()))] = at;
    objects_.append(v);
    trace_.append(object_);
  }

  // False when a key is no atom: the dict is then an object leaf.
  bool VisitDict(py::handle v, const py::tuple& at) {
    const bool exact = PyDict_CheckExact(v.ptr());
    // An OrderedDict's order is its own, not the dict underneath's: walked through iteration.
    py::tuple keys = exact ? py::reinterpret_steal<py::tuple>(
                                 PyList_AsTuple(py::reinterpret_steal<py::list>(PyDict_Keys(v.ptr())).ptr()))
                           : py::reinterpret_steal<py::tuple>(PySequence_Tuple(v.ptr()));
    if (!keys) throw py::error_already_set();
    const Py_ssize_t n = PyTuple_GET_SIZE(keys.ptr());
    py::tuple key_types(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyTypeObject* kt = Py_TYPE(PyTuple_GET_ITEM(keys.ptr(), i));
      if (!IsAtomType(kt)) return false;
      key_types[i] = py::handle(reinterpret_cast<PyObject*>(kt));
    }
    Enter(v);
    py::object attrs = py::none();
    if (!exact) {
      py::object d = py::getattr(v, "__dict__", py::none());
      if (!d.is_none() && PyObject_IsTrue(d.ptr()) == 1) attrs = d;
    }
    const bool ddict = reinterpret_cast<PyObject*>(Py_TYPE(v.ptr())) == ddict_.ptr();
    py::object factory = ddict ? py::getattr(v, "default_factory") : py::none();
    trace_.append(py::make_tuple(dict_tag_, py::handle(reinterpret_cast<PyObject*>(Py_TYPE(v.ptr()))), keys, key_types,
                                 factory, py::bool_(!attrs.is_none())));
    if (exact) {
      PyObject* key = nullptr;
      PyObject* value = nullptr;
      Py_ssize_t pos = 0;
      while (PyDict_Next(v.ptr(), &pos, &key, &value)) Child(value, at, key);
    } else {
      for (Py_ssize_t i = 0; i < n; ++i) {
        py::handle key = PyTuple_GET_ITEM(keys.ptr(), i);
        py::object value = py::reinterpret_steal<py::object>(PyObject_GetItem(v.ptr(), key.ptr()));
        if (!value) throw py::error_already_set();
        Child(value, at, key);
      }
    }
    if (!attrs.is_none()) Visit(attrs, py::make_tuple(at, py::str("__dict__")));
    return true;
  }

  // A list, tuple or namedtuple (fields: its field names, else None).
  void VisitSequence(py::handle v, const py::tuple& at, const py::object& fields) {
    py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(v.ptr(), "a sequence"));
    if (!seq) throw py::error_already_set();
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    if (fields.is_none() && AllAtoms(seq.ptr())) {
      atoms_.append(v);
      trace_.append(atom_);
      return;
    }
    Enter(v);
    trace_.append(py::make_tuple(seq_tag_, py::handle(reinterpret_cast<PyObject*>(Py_TYPE(v.ptr()))), n));
    const Py_ssize_t nfields = fields.is_none() ? 0 : PyObject_Length(fields.ptr());
    for (Py_ssize_t i = 0; i < n; ++i) {
      py::object seg = i < nfields ? py::object(fields[py::int_(i)]) : py::object(py::int_(i));
      Child(PySequence_Fast_GET_ITEM(seq.ptr(), i), at, seg);
    }
  }

  py::handle tensor_, param_, tensor_base_, odict_, ddict_, atom_, object_, dict_tag_, seq_tag_, root_seg_,
      unflattenable_;
  py::list trace_, tensors_, where_, atoms_, objects_;
  py::dict object_where_;
  std::unordered_map<PyObject*, Py_ssize_t> index_;
  std::unordered_set<PyObject*> entered_;
};

// Attribute and method names, interned once (a save reads them for every tensor).
struct Names {
  py::object signature[5] = {py::str("dtype"), py::str("shape"), py::str("device"), py::str("layout"),
                             py::str("requires_grad")};
  py::object data_ptr = py::str("data_ptr"), stride = py::str("stride"), is_neg = py::str("is_neg"),
             is_conj = py::str("is_conj");
  Names() {
    for (auto& n : signature) Intern(&n);
    for (py::object* n : {&data_ptr, &stride, &is_neg, &is_conj}) Intern(n);
  }
  static void Intern(py::object* name) {
    PyObject* p = name->release().ptr();
    PyUnicode_InternInPlace(&p);
    *name = py::reinterpret_steal<py::object>(p);
  }
};

const Names& names() {
  static const Names* n = new Names();  // (never destroyed: the interpreter may be gone by then)
  return *n;
}

// A tensor's signature: its type, then these attributes, in order.
constexpr Py_ssize_t kSignatureSize = 1 + 5;

py::object Attr(py::handle t, const py::object& name) {
  PyObject* v = PyObject_GetAttr(t.ptr(), name.ptr());
  if (v == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(v);
}

py::object Call(py::handle t, const py::object& method) {
  PyObject* v = PyObject_CallMethodNoArgs(t.ptr(), method.ptr());
  if (v == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(v);
}

bool Equal(const py::object& a, PyObject* b) {
  const int same = PyObject_RichCompareBool(a.ptr(), b, Py_EQ);
  if (same < 0) throw py::error_already_set();
  return same == 1;
}

py::tuple Signature(py::handle t) {
  py::tuple sig(kSignatureSize);
  sig[0] = py::handle(reinterpret_cast<PyObject*>(Py_TYPE(t.ptr())));
  for (Py_ssize_t i = 1; i < kSignatureSize; ++i) sig[i] = Attr(t, names().signature[i - 1]);
  return sig;
}

bool SameSignature(py::handle t, py::handle sig) {
  if (!PyTuple_Check(sig.ptr()) || PyTuple_GET_SIZE(sig.ptr()) != kSignatureSize) return false;
  if (reinterpret_cast<PyObject*>(Py_TYPE(t.ptr())) != PyTuple_GET_ITEM(sig.ptr(), 0)) return false;
  for (Py_ssize_t i = 1; i < kSignatureSize; ++i) {
    if (!Equal(Attr(t, names().signature[i - 1]), PyTuple_GET_ITEM(sig.ptr(), i))) return false;
  }
  return true;
}

py::object Reusable(const py::list& tensors, const py::list& sigs, const py::list& views,
                    const py::tuple& complex_dtypes) {
  const Py_ssize_t n = PyList_GET_SIZE(tensors.ptr());
  if (PyList_GET_SIZE(sigs.ptr()) != n || PyList_GET_SIZE(views.ptr()) != n) return py::none();
  for (Py_ssize_t k = 0; k < n; ++k) {
    if (!SameSignature(PyList_GET_ITEM(tensors.ptr(), k), PyList_GET_ITEM(sigs.ptr(), k))) return py::none();
  }
  py::list buffers(n);
  py::list fresh;
  for (Py_ssize_t k = 0; k < n; ++k) {
    py::handle t = PyList_GET_ITEM(tensors.ptr(), k);
    py::handle view = PyList_GET_ITEM(views.ptr(), k);
    py::object ptr = Call(t, names().data_ptr);
    // (Only a complex tensor can be a lazy conjugate; its dtype is the signature's.)
    PyObject* dtype = PyTuple_GET_ITEM(PyList_GET_ITEM(sigs.ptr(), k), 1);
    const int complex = PySequence_Contains(complex_dtypes.ptr(), dtype);
    if (complex < 0) throw py::error_already_set();
    const bool reuse =
        PyTuple_Check(view.ptr()) && PyTuple_GET_SIZE(view.ptr()) >= 3 && Equal(ptr, PyTuple_GET_ITEM(view.ptr(), 0)) &&
        Equal(Call(t, names().stride), PyTuple_GET_ITEM(view.ptr(), 1)) && Call(t, names().is_neg).ptr() == Py_False &&
        (complex == 0 || Call(t, names().is_conj).ptr() == Py_False);
    if (reuse) {
      buffers[k] = py::handle(PyTuple_GET_ITEM(view.ptr(), 2));
    } else {
      buffers[k] = py::none();
      fresh.append(py::make_tuple(k, ptr));
    }
  }
  return py::make_tuple(buffers, fresh);
}

}  // namespace

// Called from module.cc's PYBIND11_MODULE.
void RegisterStateWalk(py::module_& m) {
  m.def(
      "flatten", [](py::handle obj, py::handle root, const py::tuple& kinds) { return Walk(kinds).Run(obj, root); },
      py::arg("obj"), py::arg("root"), py::arg("kinds"),
      "ftrun.state_flat's walk: (trace, tensors, where, atoms, objects, object_where); see state_flat.flatten.");
  m.def(
      "signatures",
      [](const py::list& tensors) {
        py::list out;
        for (py::handle t : tensors) out.append(Signature(t));
        return out;
      },
      py::arg("tensors"), "Each tensor's (type, dtype, shape, device, layout, requires_grad) (ftrun.state_reuse).");
  m.def("reusable", &Reusable, py::arg("tensors"), py::arg("signatures"), py::arg("views"), py::arg("complex_dtypes"),
        "None when a tensor's signature differs, else (buffers, fresh) (ftrun.state_reuse).");
}

}  // namespace ftrun::python
