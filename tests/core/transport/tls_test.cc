// Mutual TLS on Endpoint TCP connections: frames flow over it, every kind
// of bad credential is refused on both sides, a plaintext peer is refused
// either way, no plaintext byte leaves a TLS connection, and the mesh
// secret is still required. Certificates come from scripts/make-test-certs.sh.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "core/transport/address.h"
#include "core/transport/endpoint.h"
#include "core/transport/tls.h"

namespace castmesh::transport {
namespace {

namespace v1 = wire::v1;
using namespace std::chrono_literals;

constexpr char kSecret[] = "tls-test-secret";

// Collects deliveries and losses of one endpoint.
class Inbox {
 public:
  MessageHandler handler() {
    return [this](const std::string&, v1::FrameHeader&& header, wire::Payload payload) {
      std::lock_guard lock(mu_);
      messages_.emplace_back(header.message_type(), std::string(payload.data(), payload.size()));
      cv_.notify_all();
    };
  }
  PeerLostHandler lost_handler() {
    return [this](const std::string&, const absl::Status& why) {
      std::lock_guard lock(mu_);
      lost_.push_back(why);
      cv_.notify_all();
    };
  }
  bool wait_messages(std::size_t n, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return messages_.size() >= n; });
  }
  // The first loss reported within `timeout`, or OK.
  absl::Status first_loss(std::chrono::milliseconds timeout = 30s) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !lost_.empty(); });
    return lost_.empty() ? absl::OkStatus() : lost_.front();
  }
  std::vector<std::pair<std::string, std::string>> messages() {
    std::lock_guard lock(mu_);
    return messages_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::string, std::string>> messages_;
  std::vector<absl::Status> lost_;
};

// What this process writes to stderr (the core's log) while it lives.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    path_ = (std::filesystem::temp_directory_path() / ("tls-test-log-" + std::to_string(::getpid()))).string();
    saved_ = ::dup(STDERR_FILENO);
    FILE* f = std::fopen(path_.c_str(), "w");
    ::dup2(::fileno(f), STDERR_FILENO);
    std::fclose(f);
  }
  std::string finish() {
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    std::string text;
    if (FILE* f = std::fopen(path_.c_str(), "r")) {
      char buf[4096];
      std::size_t n;
      while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
      std::fclose(f);
    }
    std::remove(path_.c_str());
    return text;
  }

 private:
  std::string path_;
  int saved_ = -1;
};

// The core logs a refused unauthenticated peer at most once a second (any
// peer can cause those lines): a test that reads one waits its turn.
void wait_for_log_budget() { std::this_thread::sleep_for(1100ms); }

v1::FrameHeader message(std::string type) {
  v1::FrameHeader header;
  header.set_message_type(std::move(type));
  return header;
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (std::system("openssl version >/dev/null 2>&1") != 0) return;
    char dir_template[] = "/tmp/castmesh-tls-test-XXXXXX";
    dir_ = ::mkdtemp(dir_template);
    const std::string command = std::string(CASTMESH_MAKE_TEST_CERTS) + " " + dir_ + " a b >/dev/null";
    if (std::system(command.c_str()) != 0) dir_.clear();
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  void SetUp() override {
    if (dir_.empty()) GTEST_SKIP() << "the openssl command (for scripts/make-test-certs.sh) is not available";
  }

  // The files of certificate `name` (a, b, expired, not-yet-valid, other-ca-host).
  static TlsFiles files(const std::string& name, const std::string& ca = "ca") {
    return TlsFiles{dir_ + "/" + ca + ".crt", dir_ + "/" + name + ".crt", dir_ + "/" + name + ".key"};
  }
  static EndpointOptions options(TlsFiles tls, std::string secret = kSecret) {
    EndpointOptions o;
    o.listen = "tcp:127.0.0.1:0";
    o.secret = std::move(secret);
    o.tls = std::move(tls);
    // A hang guard, not a timing: handshakes under qemu-aarch64 or a
    // sanitizer on a busy machine took over 800 ms (CI's aarch64 stage).
    // The plaintext-dialer case waits for it, once.
    o.handshake_timeout = absl::Seconds(5);
    return o;
  }
  static std::unique_ptr<Endpoint> start(EndpointOptions o, Inbox& inbox) {
    auto endpoint = Endpoint::start(std::move(o), inbox.handler(), inbox.lost_handler());
    EXPECT_TRUE(endpoint.ok()) << endpoint.status();
    return endpoint.ok() ? std::move(*endpoint) : nullptr;
  }

  // `dialer` sends to `acceptor`; the dialer's reported loss (why its
  // frame could not go), with the acceptor's log lines in `acceptor_log`.
  static absl::Status refused(TlsFiles dialer, TlsFiles acceptor, std::string* acceptor_log,
                              std::string dialer_secret = kSecret) {
    Inbox in_a, in_b;
    StderrCapture capture;
    auto b = start(options(std::move(acceptor)), in_b);
    auto a = start(options(std::move(dialer), dialer_secret), in_a);
    if (a == nullptr || b == nullptr) return absl::InternalError("endpoint did not start");
    EXPECT_TRUE(a->send(b->id(), message("hello")).ok());
    absl::Status why = in_a.first_loss();
    EXPECT_FALSE(in_b.wait_messages(1, 100ms)) << "a refused peer's frame was delivered";
    a.reset();
    b.reset();
    *acceptor_log = capture.finish();
    return why;
  }

  static std::string dir_;
};
std::string TlsTest::dir_;

TEST_F(TlsTest, MutualTlsCarriesSmallAndLargeFramesBothWays) {
  Inbox in_a, in_b;
  auto a = start(options(files("a")), in_a);
  auto b = start(options(files("b")), in_b);
  ASSERT_TRUE(a && b);
  std::string big(3 << 20, 'x');  // several TLS records, and a payload read past the buffer
  big.back() = 'y';
  ASSERT_TRUE(a->send(b->id(), message("small"), wire::Payload::copy_of("hi")).ok());
  ASSERT_TRUE(a->send(b->id(), message("big"), wire::Payload::copy_of(big)).ok());
  ASSERT_TRUE(in_b.wait_messages(2));
  EXPECT_EQ(in_b.messages()[0], (std::pair<std::string, std::string>{"small", "hi"}));
  EXPECT_EQ(in_b.messages()[1].first, "big");
  EXPECT_TRUE(in_b.messages()[1].second == big);
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(b->send(a->id(), message("reply")).ok());
  ASSERT_TRUE(in_a.wait_messages(200));
  EXPECT_TRUE(in_a.first_loss(0ms).ok());
}

TEST_F(TlsTest, BadCertificatesAreRefusedOnBothSides) {
  struct Case {
    std::string cert, reason, alert;
  };
  for (const Case& c : {Case{"expired", "certificate has expired", "certificate expired"},
                        Case{"not-yet-valid", "certificate is not yet valid", "bad certificate"},
                        Case{"other-ca-host", "unable to get local issuer certificate", "unknown ca"}}) {
    SCOPED_TRACE(c.cert);
    // The bad certificate dials: the acceptor refuses it (and logs why:
    // see ClientWithoutCertificateIsRefused for that line); the dialer
    // learns why from the acceptor's alert.
    std::string log;
    absl::Status why = refused(files(c.cert), files("b"), &log);
    EXPECT_NE(why.message().find("the peer refused this proc's TLS handshake"), std::string::npos) << why;
    EXPECT_NE(why.message().find(c.alert), std::string::npos) << why;
    // The bad certificate accepts: the dialer refuses it and says why.
    why = refused(files("a"), files(c.cert), &log);
    EXPECT_NE(why.message().find("this proc refused the peer's certificate"), std::string::npos) << why;
    EXPECT_NE(why.message().find(c.reason), std::string::npos) << why;
  }
}

TEST_F(TlsTest, AnotherCaIsRefusedEvenWithAMatchingChainOnItsSide) {
  // b trusts only the other CA: a's certificate (from the test CA) is refused.
  std::string log;
  const absl::Status why = refused(files("a"), files("other-ca-host", "other-ca"), &log);
  // (b's side sends its CA along, hence "self-signed ... in chain" rather than "no issuer")
  EXPECT_NE(why.message().find("this proc refused the peer's certificate"), std::string::npos) << why;
}

TEST_F(TlsTest, MismatchedOrExposedKeyOrMissingFileStopsTheEndpointFromStarting) {
  Inbox inbox;
  TlsFiles mismatched = files("a");
  mismatched.key_file = files("b").key_file;
  auto endpoint = Endpoint::start(options(mismatched), inbox.handler());
  ASSERT_FALSE(endpoint.ok());
  EXPECT_NE(endpoint.status().message().find("does not match the certificate"), std::string::npos)
      << endpoint.status();

  const std::string exposed = dir_ + "/exposed.key";
  std::filesystem::copy_file(files("a").key_file, exposed);
  ::chmod(exposed.c_str(), 0644);
  TlsFiles world_readable = files("a");
  world_readable.key_file = exposed;
  endpoint = Endpoint::start(options(world_readable), inbox.handler());
  ASSERT_FALSE(endpoint.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(endpoint.status())) << endpoint.status();
  EXPECT_NE(endpoint.status().message().find("0644"), std::string::npos) << endpoint.status();

  TlsFiles partial;
  partial.ca_file = files("a").ca_file;
  endpoint = Endpoint::start(options(partial), inbox.handler());
  ASSERT_FALSE(endpoint.ok());
  EXPECT_NE(endpoint.status().message().find("all three files"), std::string::npos) << endpoint.status();
}

// A TCP connection to `port` on 127.0.0.1 (blocking).
int dial(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  return fd;
}

int port_of(const Endpoint& endpoint) {
  auto address = parse_channel_address(endpoint.id());
  EXPECT_TRUE(address.ok());
  return address->port;
}

TEST_F(TlsTest, ClientWithoutCertificateIsRefused) {
  Inbox inbox;
  wait_for_log_budget();
  StderrCapture capture;
  auto b = start(options(files("b")), inbox);
  ASSERT_TRUE(b);
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  ASSERT_EQ(SSL_CTX_load_verify_locations(ctx, files("b").ca_file.c_str(), nullptr), 1);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  SSL* ssl = SSL_new(ctx);
  const int fd = dial(port_of(*b));
  SSL_set_fd(ssl, fd);
  // TLS 1.3: the client finishes first; the server's refusal of its missing
  // certificate arrives as an alert on the first read.
  const int connected = SSL_connect(ssl);
  char byte;
  const int r = connected == 1 ? SSL_read(ssl, &byte, 1) : connected;
  EXPECT_LE(r, 0);
  const std::string client_error = ERR_reason_error_string(ERR_peek_last_error()) != nullptr
                                       ? ERR_reason_error_string(ERR_peek_last_error())
                                       : "";
  EXPECT_NE(client_error.find("certificate required"), std::string::npos) << client_error;
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  ::close(fd);
  b.reset();
  const std::string log = capture.finish();
  EXPECT_NE(log.find("peer did not return a certificate"), std::string::npos) << log;
  EXPECT_FALSE(inbox.wait_messages(1, 0ms));
}

TEST_F(TlsTest, PlaintextPeerIsRefusedEitherWay) {
  std::string log;
  // A TLS dialer meets a plaintext acceptor, which sees its ClientHello.
  {
    Inbox in_a, in_b;
    wait_for_log_budget();
    StderrCapture capture;
    auto plain = start(options(TlsFiles{}), in_b);
    auto tls = start(options(files("a")), in_a);
    ASSERT_TRUE(plain && tls);
    ASSERT_TRUE(tls->send(plain->id(), message("hello")).ok());
    const absl::Status why = in_a.first_loss();
    // (its first bytes are the acceptor's challenge, or its close)
    EXPECT_NE(why.message().find("speak TLS"), std::string::npos) << why;
    EXPECT_FALSE(in_b.wait_messages(1, 100ms));
    tls.reset();
    plain.reset();
    log = capture.finish();
    EXPECT_NE(log.find("speaks TLS and this proc has no TLS configured"), std::string::npos) << "log: " << log;
  }
  // A plaintext dialer meets a TLS acceptor, which says nothing before a
  // ClientHello: both give up at the handshake deadline, saying why (the
  // acceptor's line is rate-limited: only the dialer's is checked).
  {
    Inbox in_a, in_b;
    auto tls = start(options(files("b")), in_b);
    auto plain = start(options(TlsFiles{}), in_a);
    ASSERT_TRUE(plain && tls);
    ASSERT_TRUE(plain->send(tls->id(), message("hello")).ok());
    const absl::Status why = in_a.first_loss();
    EXPECT_NE(why.message().find("does the peer require TLS"), std::string::npos) << why;
    EXPECT_FALSE(in_b.wait_messages(1, 100ms));
  }
}

TEST_F(TlsTest, ValidCertificateWithTheWrongSecretIsRefused) {
  // The acceptor finds the dialer's proof wrong and closes (as without
  // TLS, the dialer only sees the close).
  std::string log;
  wait_for_log_budget();
  const absl::Status why = refused(files("a"), files("b"), &log, "another-secret");
  EXPECT_FALSE(why.ok());
  EXPECT_NE(log.find("wrong mesh secret"), std::string::npos) << log;
}

// A TCP relay between a dialer and `target_port` that keeps every byte
// going either way, to show what a wire tap sees.
class Tap {
 public:
  explicit Tap(int target_port) : target_port_(target_port) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    EXPECT_EQ(::listen(listener_, 1), 0);
    socklen_t len = sizeof(sa);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&sa), &len);
    port_ = ntohs(sa.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~Tap() {
    stop_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    thread_.join();
    ::close(listener_);
  }
  int port() const { return port_; }
  std::string seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  void run() {
    pollfd lp{listener_, POLLIN, 0};
    while (!stop_ && ::poll(&lp, 1, 50) == 0) {
    }
    if (stop_) return;
    const int in = ::accept(listener_, nullptr, nullptr);
    const int out = dial(target_port_);
    pollfd fds[2] = {{in, POLLIN, 0}, {out, POLLIN, 0}};
    char buf[65536];
    while (!stop_) {
      if (::poll(fds, 2, 50) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP)) == 0) continue;
        const ssize_t n = ::recv(fds[i].fd, buf, sizeof(buf), 0);
        if (n <= 0) {
          stop_ = true;
          break;
        }
        {
          std::lock_guard lock(mu_);
          seen_.append(buf, static_cast<std::size_t>(n));
        }
        ::send(fds[1 - i].fd, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL);
      }
    }
    ::close(in);
    ::close(out);
  }

  int target_port_, port_ = 0, listener_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::string seen_;
};

TEST_F(TlsTest, NoPlaintextLeavesATlsConnection) {
  const std::string marker = "castmesh-plaintext-marker-0123456789";
  for (const bool tls : {false, true}) {
    SCOPED_TRACE(tls ? "tls" : "plaintext");
    Inbox in_a, in_b;
    auto b = start(options(tls ? files("b") : TlsFiles{}), in_b);
    auto a = start(options(tls ? files("a") : TlsFiles{}), in_a);
    ASSERT_TRUE(a && b);
    Tap tap(port_of(*b));
    const std::string via_tap = "tcp:127.0.0.1:" + std::to_string(tap.port());
    ASSERT_TRUE(a->send(via_tap, message(marker), wire::Payload::copy_of(marker)).ok());
    ASSERT_TRUE(a->send_data(via_tap, marker, marker, wire::Payload::copy_of(std::string(1 << 20, 'z') + marker))
                    .ok());
    ASSERT_TRUE(in_b.wait_messages(1));
    // On the established, idle connection the sending thread writes itself
    // (the direct write), through TLS when it is on.
    std::this_thread::sleep_for(20ms);
    ASSERT_TRUE(a->send(via_tap, message(marker), wire::Payload::copy_of(marker), SendUrgency::kNow).ok());
    ASSERT_TRUE(in_b.wait_messages(2));
    std::this_thread::sleep_for(100ms);  // the data frame too
    const std::string seen = tap.seen();
    EXPECT_GT(seen.size(), std::size_t{1} << 20);
    // Without TLS the tap sees the marker (so this test can fail); with it,
    // only TLS records (type 22 handshake first) and no marker.
    EXPECT_EQ(seen.find(marker) != std::string::npos, !tls);
    EXPECT_EQ(seen.find(b->id()) != std::string::npos, !tls) << "the acceptor's id in the challenge";
    if (tls) {
      EXPECT_EQ(seen[0], 0x16);
      EXPECT_EQ(seen[1], 0x03);
    }
    a.reset();
  }
}

TEST_F(TlsTest, RotatedCertificateIsUsedForNewConnections) {
  // a's certificate is replaced on disk by an expired one: b, already
  // connected, keeps the connection; a new connection from a fresh peer of
  // the same files is refused. (The reverse, a valid certificate replacing an
  // old one, takes the same path.)
  const std::string cert = dir_ + "/rotating.crt", key = dir_ + "/rotating.key";
  std::filesystem::copy_file(files("a").cert_file, cert, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(files("a").key_file, key, std::filesystem::copy_options::overwrite_existing);
  ::chmod(key.c_str(), 0600);
  Inbox in_a, in_b, in_c;
  auto a = start(options(TlsFiles{files("a").ca_file, cert, key}), in_a);
  auto b = start(options(files("b")), in_b);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(b->send(a->id(), message("before")).ok());
  ASSERT_TRUE(in_a.wait_messages(1));
  std::this_thread::sleep_for(20ms);  // a later modification time
  std::filesystem::copy_file(files("expired").cert_file, cert, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(files("expired").key_file, key, std::filesystem::copy_options::overwrite_existing);
  ASSERT_TRUE(b->send(a->id(), message("same connection")).ok());
  ASSERT_TRUE(in_a.wait_messages(2));
  auto c = start(options(files("b")), in_c);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->send(a->id(), message("new connection")).ok());
  const absl::Status why = in_c.first_loss();
  EXPECT_NE(why.message().find("certificate has expired"), std::string::npos) << why;
}

}  // namespace
}  // namespace castmesh::transport
