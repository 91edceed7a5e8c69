#include "core/transport/address.h"

#include <sys/un.h>
#include <unistd.h>

#include <charconv>

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "core/wire/handshake.h"

namespace castmesh::transport {

std::string ChannelAddress::to_string() const {
  switch (kind) {
    case Kind::kLocal:
      return absl::StrCat("local:", name);
    case Kind::kUnix:
      return absl::StrCat("unix:", abstract ? "@" : "", name);
    case Kind::kTcp:
      if (host.find(':') != std::string::npos) return absl::StrCat("tcp:[", host, "]:", port);
      return absl::StrCat("tcp:", host, ":", port);
  }
  return {};
}

absl::StatusOr<ChannelAddress> parse_channel_address(std::string_view url) {
  ChannelAddress address;
  auto invalid = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad channel address '", std::string(url), "': ", std::string(why)));
  };
  if (url.starts_with("local:")) {
    address.kind = ChannelAddress::Kind::kLocal;
    address.name = std::string(url.substr(6));
    if (address.name.empty()) return invalid("empty local name");
    return address;
  }
  if (url.starts_with("unix:")) {
    address.kind = ChannelAddress::Kind::kUnix;
    std::string_view rest = url.substr(5);
    if (rest.starts_with("@")) {
      address.abstract = true;
      rest.remove_prefix(1);
    }
    if (rest.empty()) return invalid(address.abstract ? "empty abstract socket name" : "empty unix socket path");
    // sun_path holds 108 bytes on Linux (104 on macOS and the BSDs): a path
    // needs one more for its NUL, an abstract name for its leading NUL.
    constexpr size_t kMax = sizeof(sockaddr_un{}.sun_path) - 1;
    if (rest.size() > kMax) {
      return invalid(absl::StrCat(address.abstract ? "abstract socket name" : "unix socket path", " is ",
                                  rest.size(), " bytes; at most ", kMax,
                                  " fit in a socket address (sockaddr_un.sun_path) on this system"));
    }
    address.name = std::string(rest);
    return address;
  }
  if (url.starts_with("tcp:")) {
    address.kind = ChannelAddress::Kind::kTcp;
    std::string_view rest = url.substr(4);
    const std::size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) return invalid("expected tcp:HOST:PORT");
    std::string_view host = rest.substr(0, colon);
    std::string_view port = rest.substr(colon + 1);
    if (host.starts_with("[")) {
      if (!host.ends_with("]")) return invalid("unterminated [IPv6] host");
      host = host.substr(1, host.size() - 2);
    } else if (host.find(':') != std::string_view::npos) {
      return invalid("IPv6 hosts are written in brackets: tcp:[::1]:PORT");
    }
    if (host.empty()) return invalid("empty host");
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535) {
      return invalid("port must be a number 0-65535");
    }
    address.host = std::string(host);
    address.port = static_cast<std::uint16_t>(value);
    return address;
  }
  return invalid("unknown scheme (expected local:, unix: or tcp:)");
}

std::string unique_abstract_unix_address() {
  return absl::StrCat("unix:@castmesh-", ::getpid(), "-",
                      absl::BytesToHexString(wire::make_nonce().substr(0, 6)));
}

}  // namespace castmesh::transport
