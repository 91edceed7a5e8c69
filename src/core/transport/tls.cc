#include "core/transport/tls.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/log/log.h"

namespace castmesh::transport {
namespace {

// Every reason in OpenSSL's error queue (emptying it), "; "-separated.
std::string drain_openssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    if (!out.empty()) out += "; ";
    out += reason != nullptr ? reason : absl::StrCat("OpenSSL error ", e);
  }
  return out;
}

// An alert the peer sent (its reason code is the alert's, offset): the peer
// refused something of this side's.
bool is_peer_alert(unsigned long e) { return ERR_GET_REASON(e) >= SSL_AD_REASON_OFFSET; }

// The common name of a certificate's subject, made printable (it may come
// from a peer that failed verification).
std::string common_name(X509* cert) {
  if (cert == nullptr) return "";
  char cn[256] = {0};
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn)) < 0) return "";
  return log::printable(cn);
}

std::string mode_string(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

}  // namespace

absl::Status check_tls_files(const TlsFiles& files) {
  if (files.ca_file.empty() || files.cert_file.empty() || files.key_file.empty()) {
    return absl::InvalidArgumentError(
        "mutual TLS needs all three files: a CA certificate, this proc's certificate and its private key");
  }
  for (const std::string* path : {&files.ca_file, &files.cert_file, &files.key_file}) {
    if (::access(path->c_str(), R_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("cannot read TLS file ", *path, ": ", std::strerror(errno)));
    }
  }
  struct stat st {};
  if (::stat(files.key_file.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot read TLS file ", files.key_file, ": ", std::strerror(errno)));
  }
  if ((st.st_mode & 077) != 0) {
    // Like the mesh secret file: a key others can read is a key others have.
    return absl::PermissionDeniedError(absl::StrCat("the private key file ", files.key_file, " has mode ",
                                                    mode_string(st.st_mode),
                                                    ": it must be readable by its owner only (chmod 600)"));
  }
  return absl::OkStatus();
}

bool TlsContext::Stamp::operator==(const Stamp& o) const {
  auto same = [](const timespec& a, const timespec& b) { return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec; };
  return same(ca, o.ca) && same(cert, o.cert) && same(key, o.key);
}

absl::StatusOr<TlsContext::Stamp> TlsContext::stamp_of(const TlsFiles& files) {
  Stamp stamp;
  for (auto [path, into] : {std::pair{&files.ca_file, &stamp.ca}, std::pair{&files.cert_file, &stamp.cert},
                            std::pair{&files.key_file, &stamp.key}}) {
    struct stat st {};
    if (::stat(path->c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("cannot read TLS file ", *path, ": ", std::strerror(errno)));
    }
    *into = st.st_mtim;
  }
  return stamp;
}

absl::StatusOr<SSL_CTX*> TlsContext::build(const TlsFiles& files) {
  if (absl::Status st = check_tls_files(files); !st.ok()) return st;
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr) return absl::InternalError(absl::StrCat("cannot create a TLS context: ", drain_openssl_errors()));
  auto fail = [&](std::string what) -> absl::Status {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", drain_openssl_errors()));
  };
  // TLS 1.3 only: no older protocol, cipher or renegotiation to reason about.
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
  if (SSL_CTX_load_verify_locations(ctx, files.ca_file.c_str(), nullptr) != 1) {
    return fail(absl::StrCat("cannot load the CA certificate from ", files.ca_file));
  }
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert_file.c_str()) != 1) {
    return fail(absl::StrCat("cannot load this proc's certificate from ", files.cert_file));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH) {
      return fail(absl::StrCat("the private key in ", files.key_file, " does not match the certificate in ",
                               files.cert_file));
    }
    return fail(absl::StrCat("cannot load the private key from ", files.key_file));
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return fail(absl::StrCat("the private key in ", files.key_file, " does not match the certificate in ",
                             files.cert_file));
  }
  // Both sides present a certificate and verify the other's chain against
  // the CA during the handshake, before any castmesh frame is read.
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  // No session resumption: every connection proves its certificate anew
  // (a rotated-out certificate cannot come back through a ticket), and no
  // post-handshake ticket message arrives in the middle of frames.
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  // A peer's close without close_notify is an ordinary close: castmesh
  // frames carry their own lengths, so truncation cannot go unnoticed.
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF);
  // The queue's front is re-offered from wherever it lives after a full
  // socket, possibly longer; partial writes report progress per record.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return ctx;
}

absl::StatusOr<std::shared_ptr<TlsContext>> TlsContext::load(TlsFiles files) {
  if (absl::Status st = check_tls_files(files); !st.ok()) return st;
  absl::StatusOr<Stamp> stamp = stamp_of(files);
  if (!stamp.ok()) return stamp.status();
  absl::StatusOr<SSL_CTX*> ctx = build(files);
  if (!ctx.ok()) return ctx.status();
  std::shared_ptr<TlsContext> context(new TlsContext(std::move(files)));
  detail::MutexLock lock(context->mu_);
  context->ctx_ = *ctx;
  context->stamp_ = *stamp;
  return context;
}

TlsContext::~TlsContext() {
  detail::MutexLock lock(mu_);
  SSL_CTX_free(ctx_);
}

absl::StatusOr<SSL*> TlsContext::new_ssl(int fd, bool server) {
  detail::MutexLock lock(mu_);
  if (absl::StatusOr<Stamp> stamp = stamp_of(files_); stamp.ok() && !(*stamp == stamp_)) {
    absl::StatusOr<SSL_CTX*> fresh = build(files_);
    if (fresh.ok()) {
      SSL_CTX_free(ctx_);  // SSL objects made from it hold their own reference
      ctx_ = *fresh;
      stamp_ = *stamp;
      CASTMESH_LOG_INFO("castmesh: TLS files changed on disk; new connections use the new certificate ({})",
                        files_.cert_file);
    } else {
      // Mid-rotation (a file written, its partner not yet) or a mistake:
      // keep serving with the credentials that worked.
      CASTMESH_LOG_WARN("castmesh: TLS files changed on disk but do not load ({}); keeping the previous ones",
                        fresh.status().ToString());
    }
  }
  ERR_clear_error();
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return absl::InternalError(absl::StrCat("cannot start TLS on a connection: ", drain_openssl_errors()));
  }
  if (server) {
    SSL_set_accept_state(ssl);
  } else {
    SSL_set_connect_state(ssl);
  }
  return ssl;
}

TlsSession::~TlsSession() {
  detail::MutexLock lock(mu_);
  SSL_free(ssl_);
}

TlsSession::Step TlsSession::handshake() {
  detail::MutexLock lock(mu_);
  ERR_clear_error();
  errno = 0;
  const int r = SSL_do_handshake(ssl_);
  if (r == 1) return Step::kDone;
  const int err = SSL_get_error(ssl_, r);
  if (err == SSL_ERROR_WANT_READ) return Step::kWantRead;
  if (err == SSL_ERROR_WANT_WRITE) return Step::kWantWrite;
  const int saved_errno = errno;
  const long verify = SSL_get_verify_result(ssl_);
  const unsigned long first = ERR_peek_error();
  std::string reasons = drain_openssl_errors();
  if (verify != X509_V_OK) {
    X509* cert = SSL_get0_peer_certificate(ssl_);
    const std::string cn = common_name(cert);
    error_ = absl::StrCat("this proc refused the peer's certificate", cn.empty() ? "" : absl::StrCat(" (CN=", cn, ")"),
                          ": ", X509_verify_cert_error_string(verify));
  } else if (first != 0 && is_peer_alert(first)) {
    error_ = absl::StrCat("the peer refused this proc's TLS handshake: ", reasons);
  } else if (err == SSL_ERROR_SYSCALL || err == SSL_ERROR_ZERO_RETURN) {
    error_ = saved_errno != 0 ? absl::StrCat("TLS handshake: ", std::strerror(saved_errno))
                              : "the peer closed the connection during the TLS handshake (it refused this proc's "
                                "certificate, or does not speak TLS)";
  } else {
    error_ = absl::StrCat("TLS handshake failed: ", reasons.empty() ? "unknown error" : reasons,
                          " (does the peer speak TLS?)");
  }
  return Step::kFailed;
}

ssize_t TlsSession::read(char* into, std::size_t max) {
  detail::MutexLock lock(mu_);
  ERR_clear_error();
  errno = 0;
  const int r = SSL_read(ssl_, into, static_cast<int>(std::min<std::size_t>(max, INT_MAX)));
  if (r > 0) return r;
  const int err = SSL_get_error(ssl_, r);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    errno = EAGAIN;
    return -1;
  }
  if (err == SSL_ERROR_ZERO_RETURN) return 0;
  if (err == SSL_ERROR_SYSCALL) {
    if (errno == 0) return 0;  // EOF
    return -1;                 // errno from the socket
  }
  // TLS 1.3: a client learns that the server refused its certificate
  // only here, on its first read after the handshake.
  const unsigned long first = ERR_peek_error();
  error_ = first != 0 && is_peer_alert(first)
               ? absl::StrCat("the peer refused this proc's TLS handshake: ", drain_openssl_errors())
               : absl::StrCat("TLS: ", drain_openssl_errors());
  errno = EPROTO;
  return -1;
}

ssize_t TlsSession::write(const iovec* parts, int count) {
  detail::MutexLock lock(mu_);
  std::size_t total = 0;
  for (int i = 0; i < count; ++i) {
    const char* base = static_cast<const char*>(parts[i].iov_base);
    std::size_t left = parts[i].iov_len;
    while (left > 0) {
      ERR_clear_error();
      errno = 0;
      const int r = SSL_write(ssl_, base, static_cast<int>(std::min<std::size_t>(left, INT_MAX)));
      if (r > 0) {
        total += static_cast<std::size_t>(r);
        base += r;
        left -= static_cast<std::size_t>(r);
        continue;
      }
      const int err = SSL_get_error(ssl_, r);
      if (err == SSL_ERROR_WANT_WRITE || err == SSL_ERROR_WANT_READ) return static_cast<ssize_t>(total);
      if (total > 0) return static_cast<ssize_t>(total);  // the error shows on the next call
      if (err == SSL_ERROR_SYSCALL && errno != 0) return -1;
      error_ = absl::StrCat("TLS: ", drain_openssl_errors());
      errno = err == SSL_ERROR_SYSCALL ? EPIPE : EPROTO;
      return -1;
    }
  }
  return static_cast<ssize_t>(total);
}

std::string TlsSession::error() const {
  detail::MutexLock lock(mu_);
  return error_;
}

std::string TlsSession::describe() const {
  detail::MutexLock lock(mu_);
  return absl::StrCat(SSL_get_version(ssl_), " ", SSL_get_cipher_name(ssl_), ", peer CN=",
                      common_name(SSL_get0_peer_certificate(ssl_)));
}

}  // namespace castmesh::transport
