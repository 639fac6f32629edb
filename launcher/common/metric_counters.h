// Helpers for metrics set from cumulative figures (status views): a counter
// advanced to a running total, and gauges and counters under one label set.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <chrono>
#include <map>
#include <string>

namespace ftrun {

// A counter that follows a running total kept elsewhere: Set(total) adds
// what the total grew by since the last call (a total that went down, e.g.
// after a restart of whatever keeps it, starts over from there). Returns
// what it added.
class TotalCounter {
 public:
  TotalCounter() = default;
  explicit TotalCounter(prometheus::Counter* c) : c_(c) {}
  double Set(double total) {
    const double grew = total > last_ ? total - last_ : 0;
    if (grew > 0) c_->Increment(grew);
    last_ = total;
    return grew;
  }

 private:
  prometheus::Counter* c_ = nullptr;
  double last_ = 0;
};

// Makes the metrics of one process under its labels.
class MetricMaker {
 public:
  MetricMaker(prometheus::Registry& r, prometheus::Labels labels) : r_(r), labels_(std::move(labels)) {}
  prometheus::Gauge* Gauge(const std::string& name, const std::string& help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(r_).Add(labels_);
  }
  prometheus::Counter* Counter(const std::string& name, const std::string& help, prometheus::Labels more = {}) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(r_).Add(With(more));
  }
  // Seconds, from 10 ms to 5 min (or the given bucket bounds).
  prometheus::Histogram* Seconds(const std::string& name, const std::string& help, prometheus::Labels more = {},
                                 const prometheus::Histogram::BucketBoundaries& bounds = {}) {
    static const prometheus::Histogram::BucketBoundaries kBuckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                                     2.5,  5,     10,   30,  60,   300};
    return &prometheus::BuildHistogram().Name(name).Help(help).Register(r_).Add(With(more),
                                                                                bounds.empty() ? kBuckets : bounds);
  }

 private:
  prometheus::Labels With(const prometheus::Labels& more) const {
    prometheus::Labels l = labels_;
    l.insert(more.begin(), more.end());
    return l;
  }
  prometheus::Registry& r_;
  prometheus::Labels labels_;
};

// Seconds since the Unix epoch, now (for *_timestamp_seconds gauges).
inline double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace ftrun
