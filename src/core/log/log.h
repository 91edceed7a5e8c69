// Internal logging for the core. Every castmesh log line goes through the one
// spdlog logger returned here, so its level (CASTMESH_LOG) and format are set
// in one place. Thread-safe; callable from any thread, including before
// main() finishes static initialisation and during static destruction (the
// logger is never destroyed).
#pragma once

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace castmesh::log {

// The core's logger ("castmesh", to stderr). Its level comes from the
// environment variable CASTMESH_LOG (trace, debug, info, warn, error,
// critical, off); default "warn". An unknown value logs one warning and keeps
// the default.
spdlog::logger& logger();

// Lets one line through per interval and counts the others, so that a line
// a peer can trigger at will (a refused connection, a failed accept) costs
// at most one line per interval however often it happens. Trivially
// destructible (usable as a function-local static on exit paths);
// thread-safe.
class RateLimiter {
 public:
  static constexpr std::int64_t kDefaultIntervalNs = 1'000'000'000;

  // True when the caller may log now; `suppressed` then holds how many lines
  // were dropped since the last one let through.
  bool allow(std::uint64_t* suppressed, std::int64_t interval_ns = kDefaultIntervalNs);

 private:
  std::atomic<std::int64_t> next_ns_{0};
  std::atomic<std::uint64_t> suppressed_{0};
};

// `text` that came from a peer (or anything else not trusted), made safe for
// one log line or error message: control characters (C0, DEL, C1), bytes
// that are not UTF-8 and backslashes are escaped (\n, \x1b, \\), and
// the result is cut after about `max_bytes` with "...(N bytes)" appended.
// Any thread.
std::string printable(std::string_view text, std::size_t max_bytes = 256);

// True when printable(text) would change nothing except for truncation:
// valid UTF-8 without control characters or backslash escapes to add.
bool is_printable(std::string_view text);

// True when `text` is valid UTF-8 (control characters allowed).
bool is_utf8(std::string_view text);

// " (N more like this suppressed)" or "" for N = 0.
std::string suppressed_suffix(std::uint64_t suppressed);

}  // namespace castmesh::log

#define CASTMESH_LOG_TRACE(...) SPDLOG_LOGGER_TRACE(&::castmesh::log::logger(), __VA_ARGS__)
#define CASTMESH_LOG_DEBUG(...) CASTMESH_LOG_AT_(::spdlog::level::debug, __VA_ARGS__)
#define CASTMESH_LOG_INFO(...) CASTMESH_LOG_AT_(::spdlog::level::info, __VA_ARGS__)
#define CASTMESH_LOG_WARN(...) CASTMESH_LOG_AT_(::spdlog::level::warn, __VA_ARGS__)
#define CASTMESH_LOG_ERROR(...) CASTMESH_LOG_AT_(::spdlog::level::err, __VA_ARGS__)

// At most one such line per second from this call site (log::RateLimiter);
// the next line let through says how many were dropped. For lines a peer can
// cause at will.
#define CASTMESH_LOG_WARN_LIMITED(...) CASTMESH_LOG_LIMITED_(::spdlog::level::warn, __VA_ARGS__)

#define CASTMESH_LOG_LIMITED_(lvl, ...)                                                             \
  do {                                                                                              \
    static ::castmesh::log::RateLimiter castmesh_log_limiter_;                                      \
    ::spdlog::logger& castmesh_log_logger_ = ::castmesh::log::logger();                             \
    std::uint64_t castmesh_log_suppressed_ = 0;                                                     \
    if (castmesh_log_logger_.should_log(lvl) && castmesh_log_limiter_.allow(&castmesh_log_suppressed_)) { \
      castmesh_log_logger_.log(lvl, "{}{}", ::fmt::format(__VA_ARGS__),                             \
                               ::castmesh::log::suppressed_suffix(castmesh_log_suppressed_));       \
    }                                                                                               \
  } while (0)

// Checks the level before the arguments are evaluated: a disabled
// CASTMESH_LOG_DEBUG on a hot path (e.g. every actor stop) then costs a load
// and a compare, not an Address::to_string() and a formatting call.
#define CASTMESH_LOG_AT_(lvl, ...)                                               \
  do {                                                                           \
    ::spdlog::logger& castmesh_log_logger_ = ::castmesh::log::logger();          \
    if (castmesh_log_logger_.should_log(lvl)) castmesh_log_logger_.log(lvl, __VA_ARGS__); \
  } while (0)
