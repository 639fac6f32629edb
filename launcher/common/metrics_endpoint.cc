#include "launcher/common/metrics_endpoint.h"

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <exception>

namespace ftrun {

Status MetricsEndpoint::Start(const std::string& listen, std::unique_ptr<MetricsEndpoint>* out) {
  std::unique_ptr<MetricsEndpoint> m(new MetricsEndpoint());
  try {
    m->exposer_ = std::make_unique<prometheus::Exposer>(listen, 1);
  } catch (const std::exception& e) {
    return Status::Unavailable("metrics endpoint: cannot listen on " + listen + ": " + e.what());
  }
  const auto ports = m->exposer_->GetListeningPorts();
  if (ports.empty()) return Status::Unavailable("metrics endpoint: no port to listen on at " + listen);
  m->address_ = listen.substr(0, listen.rfind(':')) + ":" + std::to_string(ports.front());
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->exposer_->RegisterCollectable(m->registry_);
  *out = std::move(m);
  return Status::Ok();
}

MetricsEndpoint::~MetricsEndpoint() = default;

}  // namespace ftrun
