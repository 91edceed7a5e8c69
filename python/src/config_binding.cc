// castmesh._castmesh's view of the settings table (castmesh/config.h):
// values cross as text; castmesh.config (config.py) turns them into Python
// values and gives them Monarch's names (configure, configured,
// get_global_config). Errors are ValueError (ErrorDomain::kValue).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "castmesh/config.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;
namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

void check(const absl::Status& status) {
  if (!status.ok()) throw_status(status, ErrorDomain::kValue);
}

const char* kind_name(config::SettingKind kind) {
  switch (kind) {
    case config::SettingKind::kBool: return "bool";
    case config::SettingKind::kInteger: return "int";
    case config::SettingKind::kChoice: return "choice";
    case config::SettingKind::kText: break;
  }
  return "str";
}

}  // namespace

void bind_config(py::module_& module) {
  module.def(
      "config_settings",
      [] {
        std::vector<std::tuple<std::string, std::string, std::string, std::string, std::string, std::string, bool>>
            rows;
        for (const config::Setting& s : config::settings()) {
          rows.emplace_back(std::string(s.key), std::string(s.env), kind_name(s.kind), std::string(s.default_text),
                            std::string(s.unit), std::string(s.meaning), s.read_once);
        }
        return rows;
      },
      "Every setting: (key, variable, kind, default text, unit, meaning, read once per process).");
  module.def(
      "config_global",
      [] {
        check(config::check_environment());
        const config::Config& now = config::global();
        Pairs values;
        for (const config::Setting& s : config::settings()) {
          values.emplace_back(std::string(s.key), value_or_throw(config::value_text(now, s.key), ErrorDomain::kValue));
        }
        return values;
      },
      "Every setting's value now, as (key, text); ValueError when the environment holds an unknown CASTMESH_ "
      "variable or a malformed value.");
  module.def(
      "config_configure", [](const Pairs& values) { check(config::configure(values)); }, py::arg("values"),
      "Sets (key, text) pairs in the runtime layer, all or nothing (ValueError).");
  module.def("config_runtime", &config::runtime_config, "The runtime layer as (key, text) pairs.");
  module.def(
      "config_set_runtime", [](const Pairs& values) { check(config::set_runtime_config(values)); },
      py::arg("values"), "Replaces the runtime layer whole (ValueError as config_configure).");
  module.def("config_clear_runtime", &config::clear_runtime_config, "Empties the runtime layer.");
}

}  // namespace castmesh::python
