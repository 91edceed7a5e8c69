// Mutual TLS 1.3 for an Endpoint's TCP connections (docs/security.md),
// over OpenSSL's libssl. TlsContext holds the proc's credentials and its
// trust root; TlsSession is one connection's TLS state over a non-blocking
// socket, driven by the connection's I/O thread.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <ctime>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "castmesh/detail/mutex.h"

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace castmesh::transport {

// Where a proc's TLS credentials are: PEM files. All empty: no TLS. Plain value.
struct TlsFiles {
  std::string ca_file;    // the CA that signs every peer's certificate (the mesh's trust root)
  std::string cert_file;  // this proc's certificate (chain), signed by that CA
  std::string key_file;   // its private key: must not be readable by group or others
  bool enabled() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
};

// Checks that all three are set and readable, and that the key file is
// private (mode 0600 or stricter): a clear error naming the file otherwise.
absl::Status check_tls_files(const TlsFiles& files);

// The credentials of one endpoint. New connections take the files' current
// content: a certificate (or CA) replaced on disk is used from the next
// connection on, without restarting (rotation); connections already open
// keep theirs. Thread-safe.
class TlsContext {
 public:
  // Loads the files. Errors: missing or unreadable file, a key that is not
  // private or does not match the certificate, a CA file with no certificate.
  static absl::StatusOr<std::shared_ptr<TlsContext>> load(TlsFiles files);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // An SSL object for a new connection over `fd` (server: the accepting
  // side), from the files' current content (reloaded when one changed; a
  // reload that fails keeps the previous credentials and logs why).
  absl::StatusOr<SSL*> new_ssl(int fd, bool server);

  const TlsFiles& files() const { return files_; }

 private:
  explicit TlsContext(TlsFiles files) : files_(std::move(files)) {}
  // The files' modification times and inodes, to notice a rotation (a
  // rename over a file changes its inode whatever the new file's time).
  struct FileStamp {
    timespec mtime{};
    ino_t inode = 0;
    bool operator==(const FileStamp& o) const;
  };
  struct Stamp {
    FileStamp ca, cert, key;
    bool operator==(const Stamp& o) const { return ca == o.ca && cert == o.cert && key == o.key; }
  };
  static absl::StatusOr<Stamp> stamp_of(const TlsFiles& files);
  static absl::StatusOr<SSL_CTX*> build(const TlsFiles& files);

  const TlsFiles files_;
  detail::Mutex mu_;
  SSL_CTX* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  Stamp stamp_ ABSL_GUARDED_BY(mu_);
};

// One connection's TLS over a non-blocking socket. Calls follow the
// recv()/sendmsg() conventions so the connection's read and write paths
// stay the same with and without TLS. Thread-safe (one lock around the SSL
// object, which OpenSSL does not let two threads use at once).
//
// Throughput: OpenSSL reads ahead (one recv() brings many records) and its
// records are encrypted into a buffer of the session's, which goes to the
// socket in one write per batch of records: one system call per many 16 KiB
// records each way instead of one (or two) per record.
class TlsSession {
 public:
  enum class Step { kDone, kWantRead, kWantWrite, kFailed };
  // Takes `ssl` (from TlsContext::new_ssl), whose socket it writes itself.
  explicit TlsSession(SSL* ssl);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // Advances the handshake, peer verification included (kFailed: error()
  // says why, naming which side refused what). kWantWrite also while this
  // side's last flight (or its refusal's alert) is still on its way out.
  Step handshake();
  // Like recv(): bytes read (> 0), 0 when the peer closed, -1 with errno
  // (EAGAIN: nothing ready, EPROTO: a TLS error, see error()). `drained`
  // (when given, after bytes were read): whether OpenSSL holds none of the
  // connection's bytes any more, i.e. its last read-ahead most likely
  // emptied the socket (what a short recv() says without TLS).
  ssize_t read(char* into, std::size_t max, bool* drained = nullptr);
  // Like sendmsg() of the parts in order: bytes taken (> 0), 0 when the
  // socket is full, -1 with errno. Bytes count as taken once their records
  // are in the socket: records encrypted but not yet sent when the socket
  // filled are sent first by the next call, which must offer the same
  // bytes again at the front of its parts (the sender's queue does).
  ssize_t write(const iovec* parts, int count);
  // Why the last call failed, for the connection's error.
  std::string error() const;
  // "TLSv1.3 TLS_AES_256_GCM_SHA384, peer CN=host-a": for logs.
  std::string describe() const;

 private:
  // Sends what out_ holds: 1 all of it, 0 the socket is full, -1 (errno) an error.
  int flush_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable detail::Mutex mu_;
  SSL* const ssl_ ABSL_PT_GUARDED_BY(mu_);
  const int fd_;
  std::string error_ ABSL_GUARDED_BY(mu_);
  // The common name of the peer certificate this side refused, written by
  // the verification callback inside handshake() (mu_ held; the callback
  // cannot say so).
  std::string refused_cn_;
  // Records OpenSSL wrote (its write BIO appends here), from out_sent_ on
  // not yet in the socket.
  std::string out_ ABSL_GUARDED_BY(mu_);
  std::size_t out_sent_ ABSL_GUARDED_BY(mu_) = 0;
  // Plaintext bytes at the front of the next write()'s parts whose records
  // are in out_ but not all sent: reported taken once they are.
  std::size_t encrypted_unsent_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace castmesh::transport
