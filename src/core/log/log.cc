#include "core/log/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
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

namespace {

// Length of the UTF-8 sequence at the start of `text` when it is valid and
// not a C1 control character (U+0080..U+009F); 0 otherwise.
std::size_t utf8_printable_length(std::string_view text) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xbf;  // allowed range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
    if (lead == 0xc2) low = 0xa0;  // U+0080..U+009F are C1 controls
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;   // no overlong forms
    if (lead == 0xed) high = 0x9f;  // no surrogates
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (text.size() < length || byte(1) < low || byte(1) > high) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xbf) return 0;
  }
  return length;
}

// Appends the escaped form of the one byte `c` (not printable as is).
void append_escaped(unsigned char c, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  switch (c) {
    case '\n': out += "\\n"; return;
    case '\r': out += "\\r"; return;
    case '\t': out += "\\t"; return;
    case '\\': out += "\\\\"; return;
    default:
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
  }
}

}  // namespace

std::string printable(std::string_view text, std::size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 16);
  std::size_t i = 0;
  while (i < text.size() && out.size() < max_bytes) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
      ++i;
    } else if (std::size_t n = c >= 0x80 ? utf8_printable_length(text.substr(i)) : 0; n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      append_escaped(c, out);
      ++i;
    }
  }
  if (i < text.size()) out += "...(" + std::to_string(text.size()) + " bytes)";
  return out;
}

bool is_printable(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      ++i;
    } else if (std::size_t n = c >= 0x80 ? utf8_printable_length(text.substr(i)) : 0; n > 0) {
      i += n;
    } else {
      return false;
    }
  }
  return true;
}

bool is_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
    } else if (std::size_t n = utf8_printable_length(text.substr(i)); n > 0) {
      i += n;
    } else if (c == 0xc2 && i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xe0) == 0x80) {
      i += 2;  // a C1 control character: valid UTF-8
    } else {
      return false;
    }
  }
  return true;
}

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
  // Never destroyed: statics of the core and of programs using it (an
  // Endpoint shut down by a static's destructor) log while the process
  // exits, after an ordinary function-local static would be gone. Its sink
  // writes to stderr and flushes every line at warn and above; what it holds
  // is reclaimed by the system at exit.
  static const std::shared_ptr<spdlog::logger>* const instance = new std::shared_ptr<spdlog::logger>(make_logger());
  return **instance;
}

}  // namespace castmesh::log
