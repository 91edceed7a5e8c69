// A program whose static objects log while it exits, after main() made the
// core's logger: an Endpoint shut down by a static's destructor (it logs
// "endpoint down" at debug level) and a static that logs a warning. Run by
// log_test (Log.LoggingDuringStaticDestructionIsSafe); CASTMESH_LOG=debug.
#include <cstdio>
#include <memory>

#include "core/log/log.h"
#include "core/transport/endpoint.h"

namespace {

struct LogsWhenDestroyed {
  ~LogsWhenDestroyed() { CASTMESH_LOG_WARN("logged during static destruction"); }
};

// Both are made before the logger (at static initialisation), so they are
// destroyed after it would be if it were an ordinary static.
std::unique_ptr<castmesh::transport::Endpoint> endpoint;
LogsWhenDestroyed logs_when_destroyed;

}  // namespace

int main() {
  CASTMESH_LOG_WARN("logger made");
  castmesh::transport::EndpointOptions options;
  options.listen = "local:log-at-exit";
  options.secret = "secret";
  auto started = castmesh::transport::Endpoint::start(options, {});
  if (!started.ok()) {
    std::fprintf(stderr, "cannot start the endpoint: %s\n", started.status().ToString().c_str());
    return 1;
  }
  endpoint = std::move(*started);
  return 0;
}
