#include "core/transport/tls.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <utility>

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

// An error that bytes which are no TLS record cause (a plaintext peer).
bool not_tls(unsigned long e) {
  switch (ERR_GET_REASON(e)) {
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_HTTP_REQUEST:
    case SSL_R_HTTPS_PROXY_REQUEST:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
    case SSL_R_UNKNOWN_PROTOCOL:
    case SSL_R_RECORD_LENGTH_MISMATCH:
      return true;
    default:
      return false;
  }
}

// The common name of a certificate's subject, made printable (it may come
// from a peer that failed verification).
std::string common_name(X509* cert) {
  if (cert == nullptr) return "";
  char cn[256] = {0};
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn)) < 0) return "";
  return log::printable(cn);
}

// How much OpenSSL reads from the socket at once (read-ahead): many records
// per recv(), where it would otherwise read each record's header and body
// with a recv() each.
constexpr long kTlsReadAhead = 256 * 1024;
// Plaintext encrypted per write() before its records go to the socket in one
// send(): large enough that system calls are a small part of a large
// transfer's cost, small enough to stay in cache between the two.
constexpr std::size_t kTlsWriteBatch = 256 * 1024;

// send() to a closed peer must not raise SIGPIPE (endpoint.cc's kNoSigPipe:
// where MSG_NOSIGNAL is missing, Asio set SO_NOSIGPIPE on the socket).
#if defined(MSG_NOSIGNAL)
constexpr int kSendFlags = MSG_DONTWAIT | MSG_NOSIGNAL;
#else
constexpr int kSendFlags = MSG_DONTWAIT;
#endif

// The write BIO of every TlsSession: appends OpenSSL's records to the
// session's out_ (its data pointer), which the session sends itself. It never
// refuses bytes, so OpenSSL never holds a half-written record.
BIO_METHOD* output_method() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "castmesh TLS output");
    BIO_meth_set_write_ex(m, [](BIO* bio, const char* data, size_t n, size_t* written) -> int {
      static_cast<std::string*>(BIO_get_data(bio))->append(data, n);
      *written = n;
      return 1;
    });
    // Flushing is the session's (flush_locked); nothing else is asked of it.
    BIO_meth_set_ctrl(m, [](BIO*, int cmd, long, void*) -> long { return cmd == BIO_CTRL_FLUSH ? 1 : 0; });
    BIO_meth_set_create(m, [](BIO* bio) -> int {
      BIO_set_init(bio, 1);
      return 1;
    });
    return m;
  }();
  return method;
}

// The verification callback of every connection: OpenSSL's verdict stands;
// a refused certificate's common name goes to the session's refused_cn_
// (the SSL's app data) for its error, since OpenSSL keeps no peer
// certificate it refused.
int note_refused_certificate(int ok, X509_STORE_CTX* store) {
  if (ok == 1) return 1;
  auto* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* refused_cn = ssl != nullptr ? static_cast<std::string*>(SSL_get_app_data(ssl)) : nullptr;
  if (refused_cn != nullptr && refused_cn->empty()) *refused_cn = common_name(X509_STORE_CTX_get0_cert(store));
  return 0;
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

bool TlsContext::FileStamp::operator==(const FileStamp& o) const {
  return mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec && inode == o.inode;
}

absl::StatusOr<TlsContext::Stamp> TlsContext::stamp_of(const TlsFiles& files) {
  Stamp stamp;
  for (auto [path, into] : {std::pair{&files.ca_file, &stamp.ca}, std::pair{&files.cert_file, &stamp.cert},
                            std::pair{&files.key_file, &stamp.key}}) {
    struct stat st {};
    if (::stat(path->c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("cannot read TLS file ", *path, ": ", std::strerror(errno)));
    }
    *into = FileStamp{st.st_mtim, st.st_ino};
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
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, note_refused_certificate);
  // No session resumption: every connection proves its certificate anew
  // (a rotated-out certificate cannot come back through a ticket), and no
  // post-handshake ticket message arrives in the middle of frames.
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  // A peer's close without close_notify is an ordinary close: castmesh
  // frames carry their own lengths, so truncation cannot go unnoticed.
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_read_ahead(ctx, 1);
  SSL_CTX_set_default_read_buffer_len(ctx, kTlsReadAhead);
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

TlsSession::TlsSession(SSL* ssl) : ssl_(ssl), fd_(SSL_get_rfd(ssl)) {
  detail::MutexLock lock(mu_);
  // Records go to out_, which flush_locked() sends: one send() for many
  // records. The socket stays the read BIO (with read-ahead).
  BIO* output = BIO_new(output_method());
  BIO_set_data(output, &out_);
  SSL_set0_wbio(ssl_, output);
  SSL_set_app_data(ssl_, &refused_cn_);
}

TlsSession::~TlsSession() {
  detail::MutexLock lock(mu_);
  SSL_free(ssl_);
}

int TlsSession::flush_locked() {
  while (out_sent_ < out_.size()) {
    const ssize_t n = ::send(fd_, out_.data() + out_sent_, out_.size() - out_sent_, kSendFlags);
    if (n > 0) {
      out_sent_ += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n == 0) errno = EPIPE;
    return -1;
  }
  out_.clear();  // keeps its capacity for the next batch
  out_sent_ = 0;
  return 1;
}

TlsSession::Step TlsSession::handshake() {
  detail::MutexLock lock(mu_);
  // This side's previous flight first: the peer waits for it.
  if (const int flushed = flush_locked(); flushed <= 0) {
    if (flushed == 0) return Step::kWantWrite;
    error_ = absl::StrCat("TLS handshake: ", std::strerror(errno));
    return Step::kFailed;
  }
  ERR_clear_error();
  errno = 0;
  const int r = SSL_do_handshake(ssl_);
  const int err = r == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl_, r);
  const int saved_errno = errno;
  // What the step wrote (a flight, or the alert of a refusal: the peer
  // learns why) goes out now, as far as the socket takes it.
  const int flushed = flush_locked();
  if (r == 1 || err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    if (flushed < 0) {
      error_ = absl::StrCat("TLS handshake: ", std::strerror(errno));
      return Step::kFailed;
    }
    if (flushed == 0 || err == SSL_ERROR_WANT_WRITE) return Step::kWantWrite;
    return r == 1 ? Step::kDone : Step::kWantRead;
  }
  const long verify = SSL_get_verify_result(ssl_);
  const unsigned long first = ERR_peek_error();
  std::string reasons = drain_openssl_errors();
  if (verify != X509_V_OK) {
    std::string cn = common_name(SSL_get0_peer_certificate(ssl_));
    if (cn.empty()) cn = refused_cn_;
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
                          first != 0 && not_tls(first) ? " (does the peer speak TLS?)" : "");
  }
  return Step::kFailed;
}

ssize_t TlsSession::read(char* into, std::size_t max, bool* drained) {
  detail::MutexLock lock(mu_);
  ERR_clear_error();
  errno = 0;
  const int limit = static_cast<int>(std::min<std::size_t>(max, INT_MAX));
  int r = SSL_read(ssl_, into, limit);
  const int err = r > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl_, r);
  const int saved_errno = errno;
  // SSL_read returns one record; the further records its read-ahead holds
  // go into the same call (one lock and one pass of the caller's loop for
  // many 16 KiB records). A failure there shows on the next call.
  int got = r;
  while (r > 0 && got < limit && SSL_pending(ssl_) == 0 && SSL_has_pending(ssl_) == 1) {
    ERR_clear_error();
    r = SSL_read(ssl_, into + got, limit - got);
    if (r > 0) got += r;
  }
  if (got > 0) ERR_clear_error();  // a WANT_READ that ended the loop
  // A read may answer (an alert when it fails): out as far as the socket
  // takes it; records of a write() in progress stay first in line.
  if (out_sent_ < out_.size()) (void)flush_locked();
  if (got > 0) {
    if (drained != nullptr) *drained = SSL_has_pending(ssl_) == 0;
    return got;
  }
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    errno = EAGAIN;
    return -1;
  }
  if (err == SSL_ERROR_ZERO_RETURN) return 0;
  if (err == SSL_ERROR_SYSCALL) {
    if (saved_errno == 0) return 0;  // EOF
    errno = saved_errno;             // from the socket
    return -1;
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
  // Records of the previous call first; their plaintext is the front of
  // `parts` (offered again), taken once they are all in the socket.
  if (const int flushed = flush_locked(); flushed <= 0) return flushed;
  std::size_t taken = std::exchange(encrypted_unsent_, 0);
  int i = 0;
  std::size_t at = taken;  // into parts[i]
  while (i < count && at >= parts[i].iov_len) at -= parts[i++].iov_len;
  // Then up to kTlsWriteBatch more, encrypted into out_ and sent at once.
  std::size_t encrypted = 0;
  while (i < count && encrypted < kTlsWriteBatch) {
    const std::size_t n = std::min(parts[i].iov_len - at, kTlsWriteBatch - encrypted);
    ERR_clear_error();
    const int r = SSL_write(ssl_, static_cast<const char*>(parts[i].iov_base) + at, static_cast<int>(n));
    if (r <= 0) {
      // The output BIO takes everything: only a TLS failure gets here.
      error_ = absl::StrCat("TLS: ", drain_openssl_errors());
      if (taken > 0) return static_cast<ssize_t>(taken);  // the error shows on the next call
      errno = EPROTO;
      return -1;
    }
    encrypted += static_cast<std::size_t>(r);
    at += static_cast<std::size_t>(r);
    if (at == parts[i].iov_len) {
      ++i;
      at = 0;
    }
  }
  const int flushed = flush_locked();
  if (flushed < 0) return taken > 0 ? static_cast<ssize_t>(taken) : -1;
  if (flushed == 1) {
    taken += encrypted;
  } else {
    encrypted_unsent_ = encrypted;  // taken by the call that sends the rest
  }
  return static_cast<ssize_t>(taken);
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
