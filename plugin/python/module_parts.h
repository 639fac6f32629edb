// The parts of the _ftrun module defined outside module.cc, registered by
// its PYBIND11_MODULE.
#pragma once

#include <pybind11/pybind11.h>

namespace ftrun::python {

// persist_binding.cc: read_persisted, list_persisted.
void RegisterPersist(pybind11::module_& m);
// warm_binding.cc: encode_warm_fields, decode_warm_fields, WARM_KINDS, FRAME_MAGIC.
void RegisterWarm(pybind11::module_& m);
// state_walk.cc: flatten, signatures, reusable (ftrun.state_flat, state_reuse).
void RegisterStateWalk(pybind11::module_& m);

}  // namespace ftrun::python
