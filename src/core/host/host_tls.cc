#include "core/host/host_tls.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "castmesh/host_mesh.h"

namespace castmesh::host {

absl::StatusOr<transport::TlsFiles> tls_files_of(const std::string& ca, const std::string& cert,
                                                 const std::string& private_key) {
  if (ca == kTrustAllConnections || ca.empty()) {
    if (!cert.empty() || !private_key.empty()) {
      return absl::InvalidArgumentError(
          "a certificate or private key was given with ca=\"trust_all_connections\": mutual TLS needs the CA file "
          "that signs every host's certificate as ca");
    }
    return transport::TlsFiles{};
  }
  if (cert.empty() || private_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ca=", ca, " turns on mutual TLS, which also needs this side's certificate (cert) and private key "
        "(private_key) files, signed by that CA"));
  }
  transport::TlsFiles files;
  for (auto [from, into] : {std::pair{&ca, &files.ca_file}, std::pair{&cert, &files.cert_file},
                            std::pair{&private_key, &files.key_file}}) {
    std::error_code ec;
    std::filesystem::path absolute = std::filesystem::absolute(*from, ec);
    *into = ec ? *from : absolute.lexically_normal().string();
  }
  if (absl::Status st = transport::check_tls_files(files); !st.ok()) return st;
  return files;
}

}  // namespace castmesh::host
