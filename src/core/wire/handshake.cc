#include "core/wire/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <stdexcept>

#include "absl/strings/escaping.h"

namespace castmesh::wire {
namespace {

std::string random_bytes(std::size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    // Without randomness the handshake would be replayable: refuse to go on.
    throw std::runtime_error("castmesh: OpenSSL RAND_bytes failed");
  }
  return out;
}

// HMAC-SHA256(secret, label | 0 | a | 0 | b | 0 | c); the separators keep
// the fields from sliding into each other.
std::string hmac(std::string_view secret, std::string_view label, std::string_view a,
                 std::string_view b, std::string_view c) {
  std::string message;
  message.reserve(label.size() + a.size() + b.size() + c.size() + 3);
  for (std::string_view part : {label, a, b}) {
    message.append(part);
    message.push_back('\0');
  }
  message.append(c);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_size = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &out_size);
  return std::string(reinterpret_cast<const char*>(out), out_size);
}

}  // namespace

std::string make_nonce() { return random_bytes(kNonceSize); }

std::string make_secret() { return absl::BytesToHexString(random_bytes(32)); }

std::string connector_mac(std::string_view secret, std::string_view acceptor_nonce,
                          std::string_view connector_nonce, std::string_view connector_proc) {
  return hmac(secret, "castmesh/v1/connector", acceptor_nonce, connector_nonce, connector_proc);
}

std::string acceptor_mac(std::string_view secret, std::string_view connector_nonce,
                         std::string_view acceptor_nonce, std::string_view acceptor_proc) {
  return hmac(secret, "castmesh/v1/acceptor", connector_nonce, acceptor_nonce, acceptor_proc);
}

bool mac_equal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace castmesh::wire
