#include "plugin/python/errors.h"

namespace py = pybind11;

namespace ftrun::python {
namespace {

PyObject* g_error = nullptr;
PyObject* g_invalid_argument = nullptr;

}  // namespace

void RegisterErrors(py::module_& m) {
  g_error = PyErr_NewExceptionWithDoc("_ftrun.Error",
                                      "An ftrun call failed; .code is the status code name, .message the text.",
                                      PyExc_RuntimeError, nullptr);
  if (g_error == nullptr) throw py::error_already_set();
  py::tuple bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError));
  g_invalid_argument = PyErr_NewExceptionWithDoc(
      "_ftrun.InvalidArgumentError", "An ftrun call rejected its arguments (INVALID_ARGUMENT).", bases.ptr(), nullptr);
  if (g_invalid_argument == nullptr) throw py::error_already_set();
  m.add_object("Error", py::handle(g_error));
  m.add_object("InvalidArgumentError", py::handle(g_invalid_argument));
}

[[noreturn]] void Raise(const Status& st) {
  PyObject* type = st.code() == Code::kInvalidArgument ? g_invalid_argument : g_error;
  py::object exc = py::reinterpret_borrow<py::object>(type)(st.ToString());
  exc.attr("code") = CodeName(st.code());
  exc.attr("message") = st.message();
  PyErr_SetObject(type, exc.ptr());
  throw py::error_already_set();
}

}  // namespace ftrun::python
