// Cross-process transport benchmark: castmesh Endpoint vs a raw-socket
// baseline written here, over Unix and TCP loopback, in one run.
//
//   transport_bench [--quick]
//   transport_bench --latency[=RUNS] [--rounds=N]
//       only the issue-37 8 B round trips: RUNS (default 7) alternating
//       raw/castmesh runs per figure, every run printed, then the medians
//       and castmesh/raw ratios ("median" lines, tab-separated); --ask adds
//       ActorRef::ask().get() to an actor in a worker proc; --read-spin=US
//       sets EndpointOptions::read_spin on both endpoints (default 0).
//
// Each measurement starts a server process (this binary re-executed with
// --serve ...), so client and server are separate processes as in a real
// mesh. Figures:
//   rtt      ping-pong round trip, 8-byte payload (raw: 8-byte read/write)
//            castmesh "io": the next ping is sent from the reply handler
//            (transport cost only); "thread": a user thread sends and
//            waits for each reply with Future::get() (adds the hand-off
//            from the I/O thread to the waiting thread).
//   tput     one-way stream of N messages of 1 KiB / 1 MiB / 64 MiB, then
//            an ack; MiB/s of payload.
//   burst    1,000,000 one-way 16-byte messages from one thread; msg/s.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "castmesh/actor.h"
#include "castmesh/port.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/runtime.h"
#include "core/transport/address.h"
#include "core/transport/endpoint.h"

extern char** environ;

// --- actors for the remote ask round trip -------------------------------------

struct BenchPing {
  int64_t n = 0;
};
static absl::Status encode_bench_ping(const BenchPing& m, std::string* out) {
  *out = std::to_string(m.n);
  return absl::OkStatus();
}
static absl::Status decode_bench_ping(std::string_view b, BenchPing* m) {
  return absl::SimpleAtoi(absl::string_view(b.data(), b.size()), &m->n) ? absl::OkStatus()
                                                                         : absl::InvalidArgumentError("bad ping");
}
CASTMESH_REGISTER_MESSAGE(BenchPing, "bench.Ping", encode_bench_ping, decode_bench_ping);

class BenchEcho : public castmesh::Actor {
 public:
  int64_t echo(const BenchPing& p) { return p.n; }
  using Handlers = castmesh::Handlers<&BenchEcho::echo>;
};
CASTMESH_REGISTER_ACTOR(BenchEcho);

// The same echo, declaring short handlers: an ask that finds it idle runs
// on the worker proc's I/O thread (castmesh/actor.h, kShortHandlers).
class BenchShortEcho : public castmesh::Actor {
 public:
  static constexpr bool kShortHandlers = true;
  int64_t echo(const BenchPing& p) { return p.n; }
  using Handlers = castmesh::Handlers<&BenchShortEcho::echo>;
};
CASTMESH_REGISTER_ACTOR(BenchShortEcho);

namespace {

using castmesh::transport::Endpoint;
using castmesh::transport::EndpointOptions;
namespace v1 = castmesh::wire::v1;
using castmesh::wire::Payload;
using Clock = std::chrono::steady_clock;

constexpr char kSecret[] = "bench-secret";

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// --- raw sockets -------------------------------------------------------------

bool write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}
bool read_all(int fd, void* data, std::size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// Listens on a fresh abstract Unix name or a free loopback TCP port; returns
// the fd and writes the address ("unix:@..." / "tcp:127.0.0.1:N").
int raw_listen(const std::string& kind, std::string& url) {
  if (kind == "unix") {
    url = castmesh::transport::unique_abstract_unix_address();
    const std::string name = url.substr(6);
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path + 1, name.data(), name.size());
    ::bind(fd, reinterpret_cast<sockaddr*>(&sa), static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size()));
    ::listen(fd, 4);
    return fd;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  ::listen(fd, 4);
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  url = "tcp:127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
  return fd;
}

int raw_connect(const std::string& url) {
  auto address = castmesh::transport::parse_channel_address(url);
  int fd;
  if (address->kind == castmesh::transport::ChannelAddress::Kind::kUnix) {
    fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path + 1, address->name.data(), address->name.size());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa),
                  static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + address->name.size())) != 0) return -1;
  } else {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(address->port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) return -1;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

// Raw server: "echo" answers each 8-byte read; "sink" reads count messages
// (u64 length + bytes, into one reused buffer) and answers one ack byte.
int serve_raw(const std::string& kind, const std::string& mode) {
  std::string url;
  int listener = raw_listen(kind, url);
  std::printf("%s\n", url.c_str());
  std::fflush(stdout);
  int fd = ::accept(listener, nullptr, nullptr);
  int one = 1;
  if (kind == "tcp") ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (mode == "echo") {
    char buf[8];
    while (read_all(fd, buf, sizeof(buf)) && write_all(fd, buf, sizeof(buf))) {
    }
    return 0;
  }
  std::vector<char> buffer;
  std::uint64_t count = 0;
  while (read_all(fd, &count, sizeof(count))) {
    for (std::uint64_t i = 0; i < count; ++i) {
      std::uint64_t size = 0;
      if (!read_all(fd, &size, sizeof(size))) return 1;
      if (buffer.size() < size) buffer.resize(size);
      if (!read_all(fd, buffer.data(), size)) return 1;
    }
    char ack = 1;
    write_all(fd, &ack, 1);
  }
  return 0;
}

// --- castmesh ----------------------------------------------------------------

int serve_castmesh(const std::string& kind, absl::Duration read_spin) {
  EndpointOptions options;
  options.read_spin = read_spin;
  options.listen = kind == "unix" ? castmesh::transport::unique_abstract_unix_address() : "tcp:127.0.0.1:0";
  options.secret = kSecret;
  Endpoint* self = nullptr;
  std::uint64_t received = 0;
  std::atomic<bool> done{false};
  auto endpoint = Endpoint::start(
      options,
      [&](const std::string& peer, v1::FrameHeader&& envelope, Payload payload) {
        if (envelope.message_type() == "ping") {
          v1::FrameHeader pong;
          pong.set_message_type("pong");
          (void)self->send(peer, std::move(pong), std::move(payload));
        } else if (envelope.message_type() == "data") {
          ++received;
        } else if (envelope.message_type() == "done") {
          v1::FrameHeader ack;
          ack.set_message_type("ack");
          ack.set_correlation(received);
          received = 0;
          (void)self->send(peer, std::move(ack));
        }
      },
      [&](const std::string&, const absl::Status&) {
        done = true;
        done.notify_all();
      });
  if (!endpoint.ok()) {
    std::fprintf(stderr, "serve: %s\n", endpoint.status().ToString().c_str());
    return 1;
  }
  self = endpoint->get();
  std::printf("%s\n", self->id().c_str());
  std::fflush(stdout);
  done.wait(false);  // until the client disconnects
  return 0;
}

// A server process and the address it printed.
struct Server {
  pid_t pid = -1;
  std::string url;
  ~Server() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

std::unique_ptr<Server> spawn_server(const std::vector<std::string>& args) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return nullptr;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipefd[0]);
  std::vector<std::string> argv_storage = {"/proc/self/exe", "--serve"};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto server = std::make_unique<Server>();
  if (posix_spawn(&server->pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ) != 0) return nullptr;
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipefd[1]);
  char c;
  while (::read(pipefd[0], &c, 1) == 1 && c != '\n') server->url.push_back(c);
  ::close(pipefd[0]);
  return server;
}

// Client side of the castmesh measurements: one endpoint, the reply handler
// drives ping-pong chains or signals the waiting thread.
class Client {
 public:
  explicit Client(const std::string& server, absl::Duration read_spin = absl::ZeroDuration()) : server_(server) {
    EndpointOptions options;
    options.read_spin = read_spin;
    options.secret = kSecret;
    auto endpoint = Endpoint::start(options, [this](const std::string&, v1::FrameHeader&& e, Payload p) {
      on_reply(std::move(e), std::move(p));
    });
    endpoint_ = std::move(*endpoint);
  }

  // Ping-pong driven from the I/O thread: each pong sends the next ping.
  double rtt_io_us(int rounds) {
    remaining_ = rounds;
    chain_ = true;
    replies_ = 0;
    const auto t0 = Clock::now();
    ping();
    wait_replies(rounds);
    chain_ = false;
    return seconds_since(t0) * 1e6 / rounds;
  }

  // Ping-pong from this thread: send, block until the pong, repeat. The
  // thread waits the way every castmesh caller does (Future::get(), which a
  // OncePort answered from the reply handler resolves), so this is
  // castmesh's plain-thread send+wait, waiting included.
  double rtt_thread_us(int rounds) {
    const auto t0 = Clock::now();
    for (int i = 0; i < rounds; ++i) {
      auto [port, reply] = castmesh::make_once_port<int>();
      {
        std::lock_guard lock(port_mu_);
        port_ = std::move(port);
      }
      ping();
      if (!reply.get().ok()) {
        std::fprintf(stderr, "thread send+wait: the reply failed\n");
        std::exit(1);
      }
    }
    return seconds_since(t0) * 1e6 / rounds;
  }

  // MiB/s of payload for `count` one-way messages of `size` bytes.
  double throughput_mib_s(std::size_t size, int count) {
    Payload payload = Payload::adopt(std::string(size, 'x'));
    replies_ = 0;
    const auto t0 = Clock::now();
    for (int i = 0; i < count; ++i) {
      v1::FrameHeader e;
      e.set_message_type("data");
      check(endpoint_->send(server_, std::move(e), payload));
    }
    finish(count);
    return double(size) * count / (1 << 20) / seconds_since(t0);
  }

  // Messages/s for a burst of small one-way messages from this thread.
  double burst_msg_s(int count) {
    Payload payload = Payload::copy_of("0123456789abcdef");
    replies_ = 0;
    const auto t0 = Clock::now();
    for (int i = 0; i < count; ++i) {
      v1::FrameHeader e;
      e.set_message_type("data");
      check(endpoint_->send(server_, std::move(e), payload));
    }
    finish(count);
    return count / seconds_since(t0);
  }

 private:
  static void check(const absl::Status& st) {
    if (!st.ok()) {
      std::fprintf(stderr, "send failed: %s\n", st.ToString().c_str());
      std::exit(1);
    }
  }
  void ping() {
    v1::FrameHeader e;
    e.set_message_type("ping");
    check(endpoint_->send(server_, std::move(e), Payload::copy_of("8bytes!!")));
  }
  void finish(int count) {
    v1::FrameHeader done;
    done.set_message_type("done");
    check(endpoint_->send(server_, std::move(done)));
    wait_replies(1);
    if (acked_ != static_cast<std::uint64_t>(count)) {
      std::fprintf(stderr, "server counted %llu of %d\n", static_cast<unsigned long long>(acked_), count);
      std::exit(1);
    }
  }
  void on_reply(v1::FrameHeader&& e, Payload) {
    if (e.message_type() == "ack") acked_ = e.correlation();
    {
      std::lock_guard lock(port_mu_);
      if (port_.has_value()) {
        port_->send(1);
        port_.reset();
      }
    }
    if (chain_ && --remaining_ > 0) ping();
    replies_.fetch_add(1, std::memory_order_release);
    replies_.notify_all();
  }
  void wait_replies(int n) {
    for (int seen = replies_.load(std::memory_order_acquire); seen < n; seen = replies_.load(std::memory_order_acquire)) {
      replies_.wait(seen, std::memory_order_acquire);
    }
  }

  std::string server_;
  std::unique_ptr<Endpoint> endpoint_;
  std::atomic<int> replies_{0};
  int remaining_ = 0;
  std::atomic<bool> chain_{false};
  std::mutex port_mu_;
  std::optional<castmesh::OncePort<int>> port_;  // rtt_thread_us's pending reply
  std::uint64_t acked_ = 0;
};

double raw_rtt_us(const std::string& kind, int rounds) {
  auto server = spawn_server({"raw", kind, "echo"});
  int fd = raw_connect(server->url);
  char buf[8] = "8bytes!";
  for (int i = 0; i < 1000; ++i) {
    write_all(fd, buf, 8);
    read_all(fd, buf, 8);
  }
  const auto t0 = Clock::now();
  for (int i = 0; i < rounds; ++i) {
    write_all(fd, buf, 8);
    read_all(fd, buf, 8);
  }
  const double us = seconds_since(t0) * 1e6 / rounds;
  ::close(fd);
  return us;
}

double raw_throughput_mib_s(const std::string& kind, std::size_t size, int count) {
  auto server = spawn_server({"raw", kind, "sink"});
  int fd = raw_connect(server->url);
  std::string payload(size, 'x');
  const auto t0 = Clock::now();
  std::uint64_t n = static_cast<std::uint64_t>(count);
  write_all(fd, &n, sizeof(n));
  for (int i = 0; i < count; ++i) {
    std::uint64_t s = size;
    write_all(fd, &s, sizeof(s));
    write_all(fd, payload.data(), size);
  }
  char ack;
  read_all(fd, &ack, 1);
  const double mib_s = double(size) * count / (1 << 20) / seconds_since(t0);
  ::close(fd);
  return mib_s;
}

void row(const char* kind, const char* what, double raw, double cm, const char* unit, bool lower_is_better) {
  if (raw > 0) {
    const double ratio = lower_is_better ? cm / raw : cm / raw;
    std::printf("%-5s %-26s %12.1f %12.1f  %-6s %6.2fx\n", kind, what, raw, cm, unit, ratio);
  } else {
    std::printf("%-5s %-26s %12s %12.1f  %-6s\n", kind, what, "-", cm, unit);
  }
  std::fflush(stdout);
}

}  // namespace

double actor_ask_rtt_us(const std::string& kind, int rounds, int reps, bool short_handlers = false);

// --latency: the issue-37 round trips only, RUNS alternating runs each
// (raw first, then castmesh, so both see the same background load), every
// run printed and the medians compared.
static int latency_main(int argc, char** argv) {
  int runs = 7;
  int rounds = 5000;
  bool with_ask = false;
  int read_spin_us = 0;  // EndpointOptions::read_spin of both endpoints
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.starts_with("--latency=") && absl::SimpleAtoi(arg.substr(10), &runs) && runs > 0) continue;
    if (arg == "--latency") continue;
    if (arg.starts_with("--read-spin=") && absl::SimpleAtoi(arg.substr(12), &read_spin_us) && read_spin_us >= 0) {
      continue;
    }
    if (arg == "--ask") {
      with_ask = true;
      continue;
    }
    if (arg.starts_with("--rounds=") && absl::SimpleAtoi(arg.substr(9), &rounds) && rounds > 0) continue;
    std::fprintf(stderr, "usage: transport_bench --latency[=RUNS] [--rounds=N] [--read-spin=US] [--ask]\n");
    return 2;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  for (const std::string kind : {"unix", "tcp"}) {
    auto server = spawn_server({"castmesh", kind, std::to_string(read_spin_us)});
    Client client(server->url, absl::Microseconds(read_spin_us));
    client.rtt_io_us(1000);  // warm-up (connect + handshake)
    std::vector<double> raw_io, cm_io, raw_thread, cm_thread;
    for (int r = 0; r < runs; ++r) {
      raw_io.push_back(raw_rtt_us(kind, rounds));
      cm_io.push_back(client.rtt_io_us(rounds));
      raw_thread.push_back(raw_rtt_us(kind, rounds));
      cm_thread.push_back(client.rtt_thread_us(rounds));
      std::printf("run\t%s\t%d\thandler-driven\t%.2f\t%.2f\tthread send+wait\t%.2f\t%.2f\n", kind.c_str(), r + 1,
                  raw_io.back(), cm_io.back(), raw_thread.back(), cm_thread.back());
      std::fflush(stdout);
    }
    const double ri = median(raw_io), ci = median(cm_io), rt = median(raw_thread), ct = median(cm_thread);
    std::printf("median\t%s\thandler-driven\t%.2f\t%.2f\t%.3f\n", kind.c_str(), ri, ci, ci / ri);
    std::printf("median\t%s\tthread send+wait\t%.2f\t%.2f\t%.3f\n", kind.c_str(), rt, ct, ct / rt);
    std::fflush(stdout);
  }
  if (with_ask) {
    // The same plain-thread round trip through the whole runtime (codec,
    // router, the echo actor's mailbox and worker), beside the raw one; and
    // to an echo with short handlers (run on the worker proc's I/O thread).
    for (const std::string kind : {"unix", "tcp"}) {
      std::vector<double> raw, ask, short_ask;
      for (int r = 0; r < runs; ++r) {
        raw.push_back(raw_rtt_us(kind, rounds));
        ask.push_back(actor_ask_rtt_us(kind, rounds, 1));
        short_ask.push_back(actor_ask_rtt_us(kind, rounds, 1, /*short_handlers=*/true));
        std::printf("run\t%s\t%d\tactor ask\t%.2f\t%.2f\tshort-handler ask\t%.2f\n", kind.c_str(), r + 1,
                    raw.back(), ask.back(), short_ask.back());
        std::fflush(stdout);
      }
      std::printf("median\t%s\tactor ask\t%.2f\t%.2f\t%.3f\n", kind.c_str(), median(raw), median(ask),
                  median(ask) / median(raw));
      std::printf("median\t%s\tshort-handler ask\t%.2f\t%.2f\t%.3f\n", kind.c_str(), median(raw),
                  median(short_ask), median(short_ask) / median(raw));
    }
  }
  return 0;
}

// Round trip of `echo.ask` from this thread, the best of `reps` runs of
// `rounds` asks, in microseconds (0: an ask failed).
template <typename Ref>
double ask_rtt_us(const Ref& echo, int rounds, int reps) {
  for (int i = 0; i < 1000; ++i) (void)echo.ask(BenchPing{i}).get();
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < rounds; ++i) {
      if (!echo.ask(BenchPing{i}).get().ok()) return 0;
    }
    best = std::min(best, seconds_since(t0) * 1e6 / rounds);
  }
  return best;
}

// Round trip of ActorRef::ask from a plain thread to an actor in a worker
// proc (LocalAllocator, same transport as `kind`), in microseconds; to
// BenchShortEcho with `short_handlers`, else BenchEcho.
double actor_ask_rtt_us(const std::string& kind, int rounds, int reps, bool short_handlers) {
  castmesh::Runtime runtime;
  castmesh::LocalAllocatorOptions options;
  options.transport = kind;
  auto mesh = castmesh::LocalAllocator(options).allocate(runtime, 1);
  if (!mesh.ok()) {
    std::fprintf(stderr, "allocate: %s\n", mesh.status().ToString().c_str());
    return 0;
  }
  if (short_handlers) {
    auto echoes = mesh->spawn<BenchShortEcho>("echo");
    return echoes.ok() ? ask_rtt_us((*echoes)[0], rounds, reps) : 0;
  }
  auto echoes = mesh->spawn<BenchEcho>("echo");
  return echoes.ok() ? ask_rtt_us((*echoes)[0], rounds, reps) : 0;
}

int main(int argc, char** argv) {
  castmesh::init(argc, argv);  // worker procs of the actor measurement stop here
  if (argc >= 3 && std::string(argv[1]) == "--serve") {
    if (std::string(argv[2]) == "raw" && argc == 5) return serve_raw(argv[3], argv[4]);
    int spin_us = 0;
    if (std::string(argv[2]) == "castmesh" && argc == 4) return serve_castmesh(argv[3], absl::ZeroDuration());
    if (std::string(argv[2]) == "castmesh" && argc == 5 && absl::SimpleAtoi(argv[4], &spin_us)) {
      return serve_castmesh(argv[3], absl::Microseconds(spin_us));
    }
    return 2;
  }
  if (argc > 1 && std::string(argv[1]).starts_with("--latency")) return latency_main(argc, argv);
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  // Each figure is the best of `reps` runs, raw and castmesh alternating, so
  // both see the same background load (this machine is shared).
  const int reps = quick ? 2 : 5;
  const int rtt_rounds = quick ? 2000 : 10000;
  // Runs raw and castmesh alternately `reps` times; the best of each.
  auto compare = [&](auto&& raw_run, auto&& cm_run, bool lower_is_better) {
    double raw = lower_is_better ? 1e300 : 0, cm = raw;
    for (int i = 0; i < reps; ++i) {
      const double r = raw_run(), c = cm_run();
      raw = lower_is_better ? std::min(raw, r) : std::max(raw, r);
      cm = lower_is_better ? std::min(cm, c) : std::max(cm, c);
    }
    return std::pair{raw, cm};
  };
  std::printf("%-5s %-26s %12s %12s  %-6s %7s\n", "chan", "measure (best of runs)", "raw", "castmesh", "unit",
              "cm/raw");
  for (const std::string kind : {"unix", "tcp"}) {
    auto server = spawn_server({"castmesh", kind});
    Client client(server->url);
    client.rtt_io_us(1000);  // warm-up (connect + handshake)
    const auto [raw_rtt, io_rtt] =
        compare([&] { return raw_rtt_us(kind, rtt_rounds); }, [&] { return client.rtt_io_us(rtt_rounds); }, true);
    const auto [raw_rtt2, thread_rtt] =
        compare([&] { return raw_rtt_us(kind, rtt_rounds); }, [&] { return client.rtt_thread_us(rtt_rounds); }, true);
    row(kind.c_str(), "rtt 8B, handler-driven", raw_rtt, io_rtt, "us", true);
    row(kind.c_str(), "rtt 8B, thread send+wait", raw_rtt2, thread_rtt, "us", true);
    struct Size {
      const char* name;
      std::size_t bytes;
      int count;
    };
    for (const Size s : {Size{"tput 1KiB", 1024, quick ? 20000 : 100000}, Size{"tput 1MiB", 1 << 20, quick ? 100 : 500},
                         Size{"tput 64MiB", 64u << 20, quick ? 4 : 8}}) {
      const auto [raw, cm] = compare([&] { return raw_throughput_mib_s(kind, s.bytes, s.count); },
                                     [&] { return client.throughput_mib_s(s.bytes, s.count); }, false);
      row(kind.c_str(), s.name, raw, cm, "MiB/s", false);
    }
    const int burst = quick ? 200000 : 1000000;
    row(kind.c_str(), "actor ask rtt (remote)", 0, actor_ask_rtt_us(kind, rtt_rounds, reps), "us", true);
    row(kind.c_str(), "burst 16B one-way", 0, compare([] { return 0.0; }, [&] { return client.burst_msg_s(burst); }, false).second / 1e3, "Kmsg/s",
        false);
  }
  return 0;
}
