// MetricsEndpoint: a Prometheus /metrics endpoint (prometheus-cpp's Exposer,
// which answers scrapes on threads of its own) and the registry behind it.
// The agent and the runner each keep one (ServedMetrics, below) when
// metrics.*_listen is set and set its metrics from their event loops
// (agent_metrics.h, job_metrics.h);
// prometheus-cpp's metrics are safe to set while a scrape reads them.
//
// Create it after the process has blocked the signals its event loop takes
// (signalfd): the endpoint's threads inherit the mask.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "ftrun/status.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace ftrun {

class MetricsEndpoint {
 public:
  // Listens on `listen` ("HOST:PORT"; port 0: any free one). Unavailable,
  // naming the address and why, when it cannot.
  static Status Start(const std::string& listen, std::unique_ptr<MetricsEndpoint>* out);
  ~MetricsEndpoint();

  prometheus::Registry& registry() { return *registry_; }
  // "HOST:PORT" with the port it listens on.
  const std::string& address() const { return address_; }

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::string address_;
};

// A set of metrics M (made in a registry: M(prometheus::Registry&, ...))
// served at an endpoint of its own: the agent's and the runner's. The
// endpoint, which holds the registry, outlives the metrics made in it.
template <class M>
class ServedMetrics {
 public:
  template <class... Args>
  static Status Start(const std::string& listen, std::unique_ptr<ServedMetrics>* out, Args&&... args) {
    std::unique_ptr<MetricsEndpoint> endpoint;
    FTRUN_RETURN_IF_ERROR(MetricsEndpoint::Start(listen, &endpoint));
    out->reset(new ServedMetrics(std::move(endpoint), std::forward<Args>(args)...));
    return Status::Ok();
  }
  M& metrics() { return metrics_; }
  const std::string& address() const { return endpoint_->address(); }

 private:
  template <class... Args>
  explicit ServedMetrics(std::unique_ptr<MetricsEndpoint> endpoint, Args&&... args)
      : endpoint_(std::move(endpoint)), metrics_(endpoint_->registry(), std::forward<Args>(args)...) {}
  std::unique_ptr<MetricsEndpoint> endpoint_;  // first: destroyed after metrics_
  M metrics_;
};

}  // namespace ftrun
