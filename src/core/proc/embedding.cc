// include/castmesh/detail/embedding.h over ProcHost.
#include "castmesh/detail/embedding.h"

#include <utility>

#include "core/platform/process.h"
#include "core/proc/proc_host.h"
#include "core/wire/handshake.h"

namespace castmesh::detail {
namespace {

ProcIdentity identity_of(std::shared_ptr<proc::ProcHost> host) {
  ProcIdentity identity;
  identity.id = host->id();
  identity.secret = host->secret();
  identity.hold = std::move(host);
  return identity;
}

}  // namespace

absl::StatusOr<ProcIdentity> attach_proc(Runtime& runtime) {
  proc::ProcHostOptions options;
  options.secret = wire::make_secret();
  absl::StatusOr<std::shared_ptr<proc::ProcHost>> host = proc::ProcHost::attach(runtime, std::move(options));
  if (!host.ok()) return host.status();
  return identity_of(*std::move(host));
}

std::optional<ProcIdentity> proc_identity(const Runtime& runtime) {
  std::shared_ptr<proc::ProcHost> host = proc::ProcHost::of(runtime);
  if (!host) return std::nullopt;
  return identity_of(std::move(host));
}

uint64_t proc_messages_sent(const Runtime& runtime) {
  std::shared_ptr<proc::ProcHost> host = proc::ProcHost::of(runtime);
  return host ? host->messages_sent() : 0;
}

void erase_from_environment(const char* name) { platform::erase_from_environment(name); }

}  // namespace castmesh::detail
