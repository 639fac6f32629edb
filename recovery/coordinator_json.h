// The fields of the runner's status.json that come from the coordinator,
// from its view: the state machine itself carries no output format.
#pragma once

#include <nlohmann/json.hpp>

#include "recovery/coordinator_view.h"

namespace ftrun {

nlohmann::json StatusJson(const CoordinatorView& v);

}  // namespace ftrun
