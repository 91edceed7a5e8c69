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
#define CASTMESH_LOG_DEBUG(...) CASTMESH_LOG_AT_(::spdlog::level::debug, __VA_ARGS__)
#define CASTMESH_LOG_INFO(...) CASTMESH_LOG_AT_(::spdlog::level::info, __VA_ARGS__)
#define CASTMESH_LOG_WARN(...) CASTMESH_LOG_AT_(::spdlog::level::warn, __VA_ARGS__)
#define CASTMESH_LOG_ERROR(...) CASTMESH_LOG_AT_(::spdlog::level::err, __VA_ARGS__)

// Checks the level before the arguments are evaluated: a disabled
// CASTMESH_LOG_DEBUG on a hot path (e.g. every actor stop) then costs a load
// and a compare, not an Address::to_string() and a formatting call.
#define CASTMESH_LOG_AT_(lvl, ...)                                               \
  do {                                                                           \
    ::spdlog::logger& castmesh_log_logger_ = ::castmesh::log::logger();          \
    if (castmesh_log_logger_.should_log(lvl)) castmesh_log_logger_.log(lvl, __VA_ARGS__); \
  } while (0)
