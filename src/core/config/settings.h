// The parts of the settings table (castmesh/config.h) other core files and
// tests use: parsing a made-up environment, the check of CASTMESH_ names,
// and the runtime layer as environment entries for procs started here.
// Pure functions of their inputs unless said otherwise; any thread.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "castmesh/config.h"

namespace castmesh::config {

// Reads a variable; nullptr when unset.
using EnvLookup = std::function<const char*(const char* name)>;

// The defaults with every setting `env` holds applied (an empty value means
// unset, as launchers export empty variables). InvalidArgument naming each
// malformed one ("CASTMESH_SHM_SPIN_US='soon' is not ...").
absl::StatusOr<Config> parse_environment(const EnvLookup& env);

// Whether `name` is a CASTMESH_ variable castmesh knows: a setting, or one
// of the other variables (launcher, rendezvous, program and test harness
// variables, which are not settings).
bool is_known_variable(std::string_view name);

// OK, or InvalidArgument naming every CASTMESH_ entry of `environment`
// ("NAME=value" strings) that is not a known variable (with the nearest
// known name when one is close).
absl::Status check_names(const std::vector<std::string_view>& environment);

// `env` ("NAME=value" entries for a child process) with this process's
// runtime layer put in: each configured setting replaces the entry of its
// variable or is added. Reads the process-wide runtime layer.
std::vector<std::string> with_runtime_config(std::vector<std::string> env);

}  // namespace castmesh::config
