// The warm control link's codec for ftrun/warm.py: the agent's own
// (plugin/protocol/warm_fields.h, plugin/ipc/wire.h), so the two sides of
// the link can never disagree on a frame or a field.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "plugin/ipc/wire.h"
#include "plugin/protocol/warm_fields.h"
#include "plugin/python/errors.h"
#include "plugin/python/module_parts.h"

namespace py = pybind11;

namespace ftrun::python {

void RegisterWarm(py::module_& m) {
  m.def(
      "encode_warm_fields",
      [](const std::map<std::string, std::string>& fields) {
        for (const auto& [k, v] : fields) {
          WarmFields one{{k, v}};
          std::string line = EncodeWarmFields(one);
          WarmFields back;
          if (line.empty() || !DecodeWarmFields(line, &back).ok()) {
            Raise(Status::InvalidArgument("warm frame: field '" + k.substr(0, 64) +
                                          "' cannot be sent (keys are letters, digits, '_' and '.'; values hold "
                                          "no newline)"));
          }
        }
        return py::bytes(EncodeWarmFields(fields));
      },
      py::arg("fields"), "A warm frame's payload (key=value lines) from a dict of str; refuses what the agent would.");
  m.def(
      "decode_warm_fields",
      [](const py::bytes& payload) {
        WarmFields fields;
        Status s = DecodeWarmFields(std::string(payload), &fields);
        if (!s.ok()) Raise(s);
        return fields;
      },
      py::arg("payload"), "A warm frame's payload as a dict of str; InvalidArgumentError for a malformed one.");
  py::dict kinds;
  kinds["error"] = static_cast<int>(MsgType::kError);
  kinds["hello"] = static_cast<int>(MsgType::kWarmHello);
  kinds["abort"] = static_cast<int>(MsgType::kWarmAbort);
  kinds["parked"] = static_cast<int>(MsgType::kWarmParked);
  kinds["start"] = static_cast<int>(MsgType::kWarmStart);
  kinds["failed"] = static_cast<int>(MsgType::kWarmFailed);
  m.attr("WARM_KINDS") = kinds;
  m.attr("FRAME_MAGIC") = py::int_(kFrameMagic);
}

}  // namespace ftrun::python
