// Internal logging for the core. Every castmesh log line goes through the one
// spdlog logger returned here, so its level (CASTMESH_LOG) and format are set
// in one place. Thread-safe; callable from any thread, including before
// main() finishes static initialisation.
#pragma once

#include <spdlog/spdlog.h>

namespace castmesh::log {

// The core's logger ("castmesh", to stderr). Its level comes from the
// environment variable CASTMESH_LOG (trace, debug, info, warn, error,
// critical, off); default "warn". An unknown value logs one warning and keeps
// the default.
spdlog::logger& logger();

}  // namespace castmesh::log

#define CASTMESH_LOG_TRACE(...) SPDLOG_LOGGER_TRACE(&::castmesh::log::logger(), __VA_ARGS__)
#define CASTMESH_LOG_DEBUG(...) ::castmesh::log::logger().debug(__VA_ARGS__)
#define CASTMESH_LOG_INFO(...) ::castmesh::log::logger().info(__VA_ARGS__)
#define CASTMESH_LOG_WARN(...) ::castmesh::log::logger().warn(__VA_ARGS__)
#define CASTMESH_LOG_ERROR(...) ::castmesh::log::logger().error(__VA_ARGS__)
