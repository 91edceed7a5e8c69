// Meters for user code (docs/observability.md, "Meters"): named counters
// and histograms, grouped by meter as OpenTelemetry's API groups them
// (get_meter(name).create_counter(name)), one series per attribute set.
// Instruments live until the process ends (what user code holds stays
// valid); their values go into the proc's metrics snapshot.
//
// Threading: thread-safe. An instrument's add/record take its own lock
// (user code's pace, not the runtime's hot path).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "castmesh/detail/mutex.h"

namespace castmesh::metrics {

enum class InstrumentKind : uint8_t { kCounter, kHistogram };

// Histogram bucket upper bounds: OpenTelemetry's default explicit bounds;
// the last bucket counts values above the last bound.
inline constexpr std::array<double, 15> kHistogramBounds = {0,   5,    10,   25,   50,   75,   100, 250,
                                                            500, 750, 1000, 2500, 5000, 7500, 10000};

// One attribute set's values. Plain value.
struct SeriesValues {
  std::string attributes;  // "k=v,k=v" sorted by key; empty: none
  uint64_t count = 0;      // add()/record() calls
  double sum = 0;          // a counter's value; a histogram's sum
  double min = 0, max = 0;                                   // histograms
  std::array<uint64_t, kHistogramBounds.size() + 1> buckets{};  // histograms
};

// One instrument as a snapshot sees it. Plain value.
struct InstrumentValues {
  std::string meter, name, description, unit;
  InstrumentKind kind = InstrumentKind::kCounter;
  std::vector<SeriesValues> series;
};

class Instrument {
 public:
  Instrument(std::string meter, std::string name, InstrumentKind kind, std::string description, std::string unit);
  // A counter adds `value` (it must not be negative: InvalidArgument from the
  // caller's binding); a histogram records it. `attributes` as SeriesValues says.
  void add(double value, std::string_view attributes = {});
  InstrumentKind kind() const { return kind_; }
  const std::string& name() const { return name_; }
  InstrumentValues values() const;

 private:
  const std::string meter_, name_;
  const InstrumentKind kind_;
  const std::string description_, unit_;
  mutable detail::Mutex mu_;
  absl::flat_hash_map<std::string, SeriesValues> series_ ABSL_GUARDED_BY(mu_);
};

// The instrument `name` of meter `meter`, made on first call; a later call
// with the same names returns the same one. A name used for the other kind
// returns nullptr (the caller reports it).
Instrument* instrument(std::string_view meter, std::string_view name, InstrumentKind kind,
                       std::string_view description = {}, std::string_view unit = {});

// Every instrument's values, in creation order.
std::vector<InstrumentValues> instrument_values();

}  // namespace castmesh::metrics
