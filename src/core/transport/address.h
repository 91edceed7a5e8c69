// Channel addresses: the URLs that name where a proc listens.
//   local:NAME        an endpoint in this same process (no socket)
//   unix:PATH         a Unix stream socket at a filesystem path
//   unix:@NAME        a Linux abstract Unix socket (no file); parsed everywhere,
//                     usable only where abstract_unix_sockets_supported()
//   tcp:HOST:PORT     TCP; HOST is an IPv4 literal, [IPv6] literal or a name
// Pure values; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace castmesh::transport {

// A parsed channel URL.
struct ChannelAddress {
  enum class Kind { kLocal, kUnix, kTcp };
  Kind kind = Kind::kLocal;
  std::string name;          // local: the name; unix: the path or abstract name (without '@')
  bool abstract = false;     // unix: Linux abstract namespace
  std::string host;          // tcp: host without brackets
  std::uint16_t port = 0;    // tcp: 0 when listening means "any free port"

  // The canonical URL ("tcp:[::1]:80" for IPv6 hosts).
  std::string to_string() const;
};

// Parses a channel URL; InvalidArgument with the reason when it is not one.
absl::StatusOr<ChannelAddress> parse_channel_address(std::string_view url);

// A fresh, unused-looking abstract Unix address for this process:
// "unix:@castmesh-<pid>-<random>" (Linux only; a proc's default listen
// address is unique_unix_listen_address() in unix_socket_names.h).
std::string unique_abstract_unix_address();

}  // namespace castmesh::transport
