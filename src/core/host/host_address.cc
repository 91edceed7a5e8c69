#include "core/host/host_address.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/proc/launch_env.h"
#include "core/proc/proc_host.h"
#include "core/transport/address.h"

namespace castmesh::host {
namespace {

constexpr char kForms[] = "expected tcp://HOST:PORT, tcp:HOST:PORT or tcp://ADVERTISE@HOST:PORT";

struct Split {
  std::string advertise;  // "" without "ADVERTISE@"
  std::string url;        // "tcp:HOST:PORT"
  transport::ChannelAddress parsed;
};

absl::StatusOr<Split> split(absl::string_view text) {
  absl::string_view rest = text;
  if (!absl::ConsumePrefix(&rest, "tcp://") && !absl::ConsumePrefix(&rest, "tcp:")) {
    return absl::InvalidArgumentError(absl::StrCat("host agent address '", text, "': ", kForms));
  }
  Split out;
  if (const size_t at = rest.find('@'); at != absl::string_view::npos) {
    out.advertise = std::string(rest.substr(0, at));
    rest.remove_prefix(at + 1);
    if (out.advertise.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("host agent address '", text, "': empty name before '@'"));
    }
  }
  out.url = absl::StrCat("tcp:", rest);
  absl::StatusOr<transport::ChannelAddress> parsed = transport::parse_channel_address(out.url);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("host agent address '", text, "': ", parsed.status().message(), " (", kForms, ")"));
  }
  out.parsed = *std::move(parsed);
  return out;
}

}  // namespace

absl::StatusOr<AgentListen> parse_agent_address(absl::string_view text) {
  absl::StatusOr<Split> parts = split(text);
  if (!parts.ok()) return parts.status();
  AgentListen out;
  out.listen = parts->url;
  if (!parts->advertise.empty()) {
    out.advertise_host = parts->advertise;
  } else if (proc::is_wildcard_host(parts->parsed.host)) {
    out.advertise_host = proc::default_advertise_host();
  }
  return out;
}

absl::StatusOr<std::string> agent_dial_address(absl::string_view text) {
  absl::StatusOr<Split> parts = split(text);
  if (!parts.ok()) return parts.status();
  if (proc::is_wildcard_host(parts->parsed.host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host agent address '", text, "' names every interface, not a host to dial; give the agent's host name"));
  }
  if (parts->parsed.port == 0) {
    return absl::InvalidArgumentError(absl::StrCat("host agent address '", text, "' has no port"));
  }
  return parts->url;
}

absl::StatusOr<std::string> resolve_mesh_secret(const std::string& explicit_secret) {
  if (!explicit_secret.empty()) return explicit_secret;
  if (const char* env = std::getenv(proc::kEnvSecret); env != nullptr && *env != '\0') return std::string(env);
  const char* file = std::getenv(kEnvSecretFile);
  if (file == nullptr || *file == '\0') {
    return absl::InvalidArgumentError(absl::StrCat(
        "no mesh secret: a host agent runs code on request and never runs without authentication; pass secret=, "
        "or set ", proc::kEnvSecret, ", or ", kEnvSecretFile, " to a file of mode 0600 holding it"));
  }
  const int fd = ::open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kEnvSecretFile, "=", file, ": cannot open it: ", std::strerror(errno)));
  }
  struct stat st {};
  const bool stated = ::fstat(fd, &st) == 0;
  std::string secret;
  absl::Status status;
  if (!stated || !S_ISREG(st.st_mode)) {
    status = absl::InvalidArgumentError(absl::StrCat(kEnvSecretFile, "=", file, " is not a regular file"));
  } else if ((st.st_mode & 077) != 0) {
    status = absl::PermissionDeniedError(absl::StrCat(
        kEnvSecretFile, "=", file, " has mode 0", (st.st_mode >> 6) & 7, (st.st_mode >> 3) & 7, st.st_mode & 7,
        ": a secret other users can read is refused; chmod 600 it"));
  } else if (st.st_uid != ::geteuid()) {
    status = absl::PermissionDeniedError(
        absl::StrCat(kEnvSecretFile, "=", file, " belongs to uid ", st.st_uid, ", not to this user"));
  } else {
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n > 0) {
        secret.append(buffer, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) status = absl::InvalidArgumentError(absl::StrCat(kEnvSecretFile, "=", file, ": ", std::strerror(errno)));
      break;
    }
  }
  ::close(fd);
  if (!status.ok()) return status;
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) return absl::InvalidArgumentError(absl::StrCat(kEnvSecretFile, "=", file, " is empty"));
  return secret;
}

}  // namespace castmesh::host
