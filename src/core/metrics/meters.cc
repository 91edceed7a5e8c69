// User meters (meters.h).
#include "core/metrics/meters.h"

#include <algorithm>
#include <memory>
#include <utility>

namespace castmesh::metrics {
namespace {

struct Registry {
  detail::Mutex mu;
  std::vector<std::unique_ptr<Instrument>> instruments ABSL_GUARDED_BY(mu);  // never removed
  absl::flat_hash_map<std::string, Instrument*> by_name ABSL_GUARDED_BY(mu);  // "meter\0name"
};

Registry& registry() {
  static Registry* r = new Registry;  // instruments stay valid while static destructors run
  return *r;
}

}  // namespace

Instrument::Instrument(std::string meter, std::string name, InstrumentKind kind, std::string description,
                       std::string unit)
    : meter_(std::move(meter)),
      name_(std::move(name)),
      kind_(kind),
      description_(std::move(description)),
      unit_(std::move(unit)) {}

void Instrument::add(double value, std::string_view attributes) {
  detail::MutexLock lock(mu_);
  auto [it, made] = series_.try_emplace(std::string(attributes));
  SeriesValues& s = it->second;
  if (made) s.attributes = std::string(attributes);
  if (kind_ == InstrumentKind::kHistogram) {
    s.min = s.count == 0 ? value : std::min(s.min, value);
    s.max = s.count == 0 ? value : std::max(s.max, value);
    size_t b = 0;
    while (b < kHistogramBounds.size() && value > kHistogramBounds[b]) ++b;
    ++s.buckets[b];
  }
  ++s.count;
  s.sum += value;
}

InstrumentValues Instrument::values() const {
  InstrumentValues out;
  out.meter = meter_;
  out.name = name_;
  out.description = description_;
  out.unit = unit_;
  out.kind = kind_;
  {
    detail::MutexLock lock(mu_);
    for (const auto& [key, s] : series_) out.series.push_back(s);
  }
  std::sort(out.series.begin(), out.series.end(),
            [](const SeriesValues& a, const SeriesValues& b) { return a.attributes < b.attributes; });
  return out;
}

Instrument* instrument(std::string_view meter, std::string_view name, InstrumentKind kind,
                       std::string_view description, std::string_view unit) {
  Registry& r = registry();
  std::string key(meter);
  key.push_back('\0');
  key.append(name);
  detail::MutexLock lock(r.mu);
  if (auto it = r.by_name.find(key); it != r.by_name.end()) {
    return it->second->kind() == kind ? it->second : nullptr;
  }
  r.instruments.push_back(std::make_unique<Instrument>(std::string(meter), std::string(name), kind,
                                                       std::string(description), std::string(unit)));
  Instrument* made = r.instruments.back().get();
  r.by_name.emplace(std::move(key), made);
  return made;
}

std::vector<InstrumentValues> instrument_values() {
  std::vector<Instrument*> all;
  {
    Registry& r = registry();
    detail::MutexLock lock(r.mu);
    for (const auto& i : r.instruments) all.push_back(i.get());
  }
  std::vector<InstrumentValues> out;
  for (Instrument* i : all) out.push_back(i->values());
  return out;
}

}  // namespace castmesh::metrics
