#include "core/proc/launch_env.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/config/settings.h"
#include "core/proc/proc_host.h"
#include "core/transport/address.h"

namespace castmesh::proc {
namespace {

// A variable's value, or nullptr when unset or empty (launchers and shells
// often export empty variables; they mean "not set").
const char* lookup(const EnvLookup& env, const char* name) {
  const char* value = env(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// A non-negative int from `value`, or an error naming the variable.
absl::StatusOr<int> parse_count(const char* name, const char* value) {
  const std::string_view text(value);
  int parsed = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  if (ec != std::errc() || end != text.data() + text.size() || parsed < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", value, "' is not a non-negative integer"));
  }
  return parsed;
}

// "[::1]" for IPv6 literals, the host as is otherwise (the tcp: URL form).
std::string url_host(const std::string& host) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host;
}

std::string ip_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

bool is_loopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  }
  return false;
}

// The rank and world size, from the first launcher whose rank variable is set.
absl::Status read_rank(const EnvLookup& env, WorkerLaunch& launch) {
  const RankSource* source = nullptr;
  for (const RankSource& candidate : kRankSources) {
    if (lookup(env, candidate.rank_variable) != nullptr) {
      source = &candidate;
      break;
    }
  }
  if (source == nullptr) {
    return absl::InvalidArgumentError(
        "no rank in the environment: set CASTMESH_RANK, or start the worker with mpirun (OMPI_COMM_WORLD_RANK), "
        "mpiexec (PMI_RANK), srun (SLURM_PROCID) or as a Kubernetes indexed Job (JOB_COMPLETION_INDEX)");
  }
  const char* rank_text = lookup(env, source->rank_variable);
  absl::StatusOr<int> rank = parse_count(source->rank_variable, rank_text);
  if (!rank.ok()) return rank.status();
  const char* size_variable = proc::kEnvWorldSize;
  const char* size_text = lookup(env, size_variable);
  if (size_text == nullptr && source->size_variable != nullptr) {
    size_variable = source->size_variable;
    size_text = lookup(env, size_variable);
  }
  if (size_text == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no world size in the environment: the rank comes from ", source->rank_variable, " (", source->launcher,
        ") but ", source->size_variable != nullptr ? absl::StrCat(source->size_variable, " and ") : "",
        kEnvWorldSize, " are unset; set ", kEnvWorldSize, " to the number of procs of the mesh"));
  }
  absl::StatusOr<int> size = parse_count(size_variable, size_text);
  if (!size.ok()) return size.status();
  launch.rank_origin = absl::StrCat(source->rank_variable, "=", rank_text, ", ", size_variable, "=", size_text);
  if (*size == 0) return absl::InvalidArgumentError(absl::StrCat("world size 0 (", launch.rank_origin, ")"));
  if (*rank >= *size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", *rank, " is not below the world size ", *size, " (", launch.rank_origin, ")"));
  }
  launch.rank = *rank;
  launch.world_size = *size;
  return absl::OkStatus();
}

// Where a proc joining `controller` listens, so that the controller (and
// the other procs) can reach it.
absl::Status choose_listen_address(const EnvLookup& env, WorkerLaunch& launch) {
  absl::StatusOr<transport::ChannelAddress> controller = transport::parse_channel_address(launch.controller);
  if (!controller.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kEnvRendezvous, "='", launch.controller, "': ", controller.status().message()));
  }
  if (controller->kind == transport::ChannelAddress::Kind::kUnix) return absl::OkStatus();  // same machine
  if (controller->kind != transport::ChannelAddress::Kind::kTcp) {
    return absl::InvalidArgumentError(
        absl::StrCat(kEnvRendezvous, "='", launch.controller, "' must be a tcp: or unix: address"));
  }
  if (const char* advertise = lookup(env, kEnvAdvertiseHost); advertise != nullptr) {
    // The given name may not be an address of a local interface (NAT,
    // containers): listen everywhere, tell the peers that name.
    const bool v6 = std::string_view(advertise).find(':') != std::string_view::npos;
    launch.listen = v6 ? "tcp:[::]:0" : "tcp:0.0.0.0:0";
    launch.advertise_host = advertise;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> local = local_address_towards(controller->host);
  if (!local.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot tell which local address reaches the controller at ",
                                               launch.controller, ": ", local.status().message(), "; set ",
                                               kEnvAdvertiseHost, " to this machine's address"));
  }
  launch.listen = absl::StrCat("tcp:", url_host(*local), ":0");
  return absl::OkStatus();
}

// The secret from the descriptor named by CASTMESH_SECRET_FD (read to its
// end, then closed).
absl::StatusOr<std::string> read_secret_from(const char* fd_text) {
  absl::StatusOr<int> fd = parse_count(kEnvSecretFd, fd_text);
  if (!fd.ok()) return fd.status();
  std::string secret;
  char buf[256];
  while (true) {
    const ssize_t n = ::read(*fd, buf, sizeof(buf));
    if (n > 0) {
      secret.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      const int error = errno;
      ::close(*fd);
      return absl::InvalidArgumentError(
          absl::StrCat(kEnvSecretFd, "=", fd_text, ": cannot read the mesh secret: ", std::strerror(error)));
    }
  }
  ::close(*fd);
  if (secret.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvSecretFd, "=", fd_text, " holds no mesh secret"));
  }
  return secret;
}

}  // namespace

bool worker_requested(const EnvLookup& env) {
  return lookup(env, kEnvBootstrap) != nullptr || lookup(env, kEnvRendezvous) != nullptr;
}

absl::StatusOr<WorkerLaunch> worker_launch_from(const EnvLookup& env) {
  WorkerLaunch launch;
  if (const char* timeout = lookup(env, kEnvJoinTimeout); timeout != nullptr) {
    absl::StatusOr<int> seconds = parse_count(kEnvJoinTimeout, timeout);
    if (!seconds.ok()) return seconds.status();
    launch.join_timeout = absl::Seconds(*seconds);
  }
  // The heartbeat (and every other setting of `env`) through the settings table: a malformed one fails the launch.
  absl::StatusOr<config::Config> settings = config::parse_environment(env);
  if (!settings.ok()) return settings.status();
  launch.heartbeat_interval = settings->heartbeat_interval;
  launch.heartbeat_timeout = settings->heartbeat_timeout;
  for (auto [name, into] : {std::pair{kEnvTlsCa, &launch.tls.ca_file}, std::pair{kEnvTlsCert, &launch.tls.cert_file},
                            std::pair{kEnvTlsKey, &launch.tls.key_file}}) {
    if (const char* path = lookup(env, name); path != nullptr) *into = path;
  }
  if (const char* secret = lookup(env, kEnvSecret); secret != nullptr) {
    launch.secret = secret;
  } else if (const char* secret_fd = lookup(env, kEnvSecretFd); secret_fd != nullptr) {
    absl::StatusOr<std::string> from_fd = read_secret_from(secret_fd);
    if (!from_fd.ok()) return from_fd.status();
    launch.secret = *std::move(from_fd);
  }
  if (const char* bootstrap = lookup(env, kEnvBootstrap); bootstrap != nullptr) {
    // Started by a LocalAllocator: everything was set by the controller.
    launch.controller = bootstrap;
    launch.started_by_controller = true;
    if (absl::Status st = read_rank(env, launch); !st.ok()) return st;
    const char* transport = lookup(env, kEnvTransport);
    if (transport != nullptr && std::string_view(transport) == "tcp") launch.listen = "tcp:127.0.0.1:0";
    return launch;
  }
  const char* rendezvous = lookup(env, kEnvRendezvous);
  if (rendezvous == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "not started as a castmesh worker: neither ", kEnvBootstrap, " (set by a LocalAllocator) nor ",
        kEnvRendezvous, " (the controller's rendezvous address, for procs started by a launcher) is set"));
  }
  launch.controller = rendezvous;
  if (launch.secret.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvRendezvous, " is set but ", kEnvSecret,
                                                   " is not: give the workers the mesh secret of the controller"));
  }
  if (absl::Status st = read_rank(env, launch); !st.ok()) return st;
  if (absl::Status st = choose_listen_address(env, launch); !st.ok()) return st;
  return launch;
}

absl::StatusOr<WorkerLaunch> worker_launch_from_environment() {
  return worker_launch_from([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

absl::StatusOr<std::string> local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "': ", ::gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("no address for '", host, "'"));
  std::string local;
  for (addrinfo* a = found; a != nullptr && local.empty(); a = a->ai_next) {
    // A connected UDP socket takes the route's source address; nothing is sent.
    const int fd = ::socket(a->ai_family, SOCK_DGRAM, 0);  // closed below; SOCK_CLOEXEC is not POSIX
    if (fd < 0) continue;
    sockaddr_storage mine{};
    socklen_t size = sizeof(mine);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &size) == 0) {
      local = ip_text(reinterpret_cast<const sockaddr*>(&mine));
    } else {
      last = absl::UnavailableError(absl::StrCat("no route to '", host, "': ", std::strerror(errno)));
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (local.empty()) return last;
  return local;
}

std::string default_advertise_host() {
  if (const char* advertise = std::getenv(kEnvAdvertiseHost); advertise != nullptr && *advertise != '\0') {
    return advertise;
  }
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    bool routable = false;
    if (::getaddrinfo(name, nullptr, &hints, &found) == 0) {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) routable = routable || !is_loopback(a->ai_addr);
      ::freeaddrinfo(found);
    }
    if (routable) return name;
  }
  std::string first;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) == 0) {
    for (ifaddrs* i = interfaces; i != nullptr && first.empty(); i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
      if (!is_loopback(i->ifa_addr)) first = ip_text(i->ifa_addr);
    }
    ::freeifaddrs(interfaces);
  }
  return first.empty() ? "127.0.0.1" : first;
}

bool is_wildcard_host(const std::string& host) { return host.empty() || host == "0.0.0.0" || host == "::"; }

}  // namespace castmesh::proc
