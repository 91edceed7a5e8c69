// Cryptographic pieces of the connection handshake (HMAC-SHA256 over the mesh
// secret, OpenSSL libcrypto). The message flow is documented in
// proto/castmesh/wire/v1/frame.proto. Pure functions; any thread.
#pragma once

#include <string>
#include <string_view>

namespace castmesh::wire {

inline constexpr std::size_t kNonceSize = 32;

// kNonceSize bytes from OpenSSL's CSPRNG.
std::string make_nonce();

// A fresh mesh secret: 32 random bytes as 64 lowercase hex characters.
std::string make_secret();

// The connector proves it knows the secret, bound to both nonces and its id.
std::string connector_mac(std::string_view secret, std::string_view acceptor_nonce,
                          std::string_view connector_nonce, std::string_view connector_proc);

// The acceptor proves it knows the secret (mutual authentication).
std::string acceptor_mac(std::string_view secret, std::string_view connector_nonce,
                         std::string_view acceptor_nonce, std::string_view acceptor_proc);

// Constant-time comparison (CRYPTO_memcmp); false when sizes differ.
bool mac_equal(std::string_view a, std::string_view b);

}  // namespace castmesh::wire
