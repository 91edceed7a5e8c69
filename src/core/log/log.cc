#include "core/log/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

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

spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

}  // namespace castmesh::log
