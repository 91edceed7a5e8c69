// The credentials arguments of host agents and controllers (Monarch's `ca`
// and `private_key`, plus `cert`) as the transport's TLS files
// (docs/security.md). Pure function of its inputs and the files; any thread.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "core/transport/tls.h"

namespace castmesh::host {

// ca "trust_all_connections" with no cert and no key: no TLS (empty
// files). ca a CA file with cert and key files: mutual TLS with them, as
// absolute paths (procs an agent starts get them in their environment and
// may run in another directory), checked readable, the key private.
// InvalidArgument for any other mix, saying what is missing.
absl::StatusOr<transport::TlsFiles> tls_files_of(const std::string& ca, const std::string& cert,
                                                 const std::string& private_key);

}  // namespace castmesh::host
