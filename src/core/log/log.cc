#include "core/log/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

namespace castmesh::log {
namespace {

std::shared_ptr<spdlog::logger> make_logger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("castmesh", std::move(sink));
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [castmesh] [pid %P] [%^%l%$] %v");
  logger->set_level(spdlog::level::warn);
  const char* env = std::getenv("CASTMESH_LOG");
  if (env != nullptr && *env != '\0') {
    const std::string value(env);
    const auto level = spdlog::level::from_str(value);
    // from_str maps anything unknown to "off"; only accept "off" when asked.
    if (level == spdlog::level::off && value != "off") {
      logger->warn("CASTMESH_LOG='{}' is not a level (trace, debug, info, warn, error, critical, off); using warn",
                   value);
    } else {
      logger->set_level(level);
    }
  }
  logger->flush_on(spdlog::level::warn);
  return logger;
}

}  // namespace

bool RateLimiter::allow(std::uint64_t* suppressed, std::int64_t interval_ns) {
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
  std::int64_t next = next_ns_.load(std::memory_order_relaxed);
  if (now < next || !next_ns_.compare_exchange_strong(next, now + interval_ns, std::memory_order_relaxed)) {
    suppressed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
  return true;
}

std::string suppressed_suffix(std::uint64_t suppressed) {
  if (suppressed == 0) return {};
  return " (" + std::to_string(suppressed) + (suppressed == 1 ? " more line like this" : " more lines like this") +
         " suppressed)";
}

spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

}  // namespace castmesh::log
