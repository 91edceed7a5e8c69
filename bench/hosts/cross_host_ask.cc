// Cross-host C++ round trips and 64 MiB transfers (issue 30's target: an
// ask within 1.3x a raw TCP round trip between the same hosts; issue 38's:
// the same over mutual TLS). Run by run_cross_host_ask.sh, which makes a
// network-namespace host with an agent and a raw echo server:
//
//   cross_host_ask echo-server HOST PORT        raw TCP echo (inside the host)
//   cross_host_ask controller AGENT HOST:PORT ROUNDS
//
// The controller measures the raw 8-byte TCP round trip to the echo server,
// then attaches to the agent, starts one proc there (this program again,
// castmesh::init) and measures an ask of an 8-byte message to an actor in
// it; three alternating repetitions, the best median of each. Then 64 MiB:
// an RdmaBuffer registered in that proc read into this one's memory (the
// socket path between hosts), beside the echo server streaming 64 MiB over
// its raw TCP connection; alternating, all runs checked, median and best.
// One "RESULT key=value..." line sums it up for the script.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "castmesh/actor.h"
#include "castmesh/host_mesh.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/rdma.h"
#include "castmesh/runtime.h"
#include "castmesh/tensor_engine.h"

namespace {

struct Ping {
  int64_t n = 0;
};
absl::Status encode_ping(const Ping& p, std::string* out) {
  out->assign(reinterpret_cast<const char*>(&p.n), sizeof(p.n));
  return absl::OkStatus();
}
absl::Status decode_ping(std::string_view in, Ping* p) {
  if (in.size() != sizeof(p->n)) return absl::InvalidArgumentError("bad Ping");
  std::memcpy(&p->n, in.data(), sizeof(p->n));
  return absl::OkStatus();
}

// Asks a proc for the CPU time its process has used.
struct CpuQuery {
  int64_t unused = 0;
};
absl::Status encode_cpu_query(const CpuQuery& q, std::string* out) {
  out->assign(reinterpret_cast<const char*>(&q.unused), sizeof(q.unused));
  return absl::OkStatus();
}
absl::Status decode_cpu_query(std::string_view in, CpuQuery* q) {
  if (in.size() != sizeof(q->unused)) return absl::InvalidArgumentError("bad CpuQuery");
  std::memcpy(&q->unused, in.data(), sizeof(q->unused));
  return absl::OkStatus();
}

// User + system CPU time of this process (all its threads), microseconds.
int64_t process_cpu_us() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000 + usage.ru_utime.tv_usec + usage.ru_stime.tv_usec;
}

}  // namespace
CASTMESH_REGISTER_MESSAGE(Ping, "bench.hosts.Ping", encode_ping, decode_ping);
CASTMESH_REGISTER_MESSAGE(CpuQuery, "bench.hosts.CpuQuery", encode_cpu_query, decode_cpu_query);

namespace {

class Echo : public castmesh::Actor {
 public:
  int64_t echo(const Ping& p) { return p.n; }
  using Handlers = castmesh::Handlers<&Echo::echo>;
};

// The same echo, declaring short handlers: an ask that finds it idle runs
// on its proc's I/O thread (castmesh/actor.h, kShortHandlers).
class ShortEcho : public castmesh::Actor {
 public:
  static constexpr bool kShortHandlers = true;
  int64_t echo(const Ping& p) { return p.n; }
  using Handlers = castmesh::Handlers<&ShortEcho::echo>;
};

}  // namespace
CASTMESH_REGISTER_ACTOR(Echo);
CASTMESH_REGISTER_ACTOR(ShortEcho);

namespace {

// Byte i of every transfer's source: the reader checks what arrived.
uint8_t pattern(int64_t i) { return static_cast<uint8_t>(i * 7 + 3); }

// Registers one buffer of `size` bytes (the pattern) for the controller to read.
class Owner : public castmesh::Actor {
 public:
  absl::StatusOr<castmesh::RdmaBuffer> make(int64_t size) {
    memory_ = castmesh::TensorView::Allocate(castmesh::DType::kUInt8, {size});
    auto* p = static_cast<uint8_t*>(memory_.data());
    for (int64_t i = 0; i < size; ++i) p[i] = pattern(i);
    return castmesh::RdmaBuffer::register_memory(memory_);
  }
  int64_t cpu(const CpuQuery&) { return process_cpu_us(); }
  using Handlers = castmesh::Handlers<&Owner::make, &Owner::cpu>;

 private:
  castmesh::TensorView memory_;
};

}  // namespace
CASTMESH_REGISTER_ACTOR(Owner);

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kBulkBytes = int64_t{64} << 20;
constexpr int kBulkRuns = 8;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

int serve_echo(const char* host, int port) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host, &addr.sin_addr);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listener, 1) != 0) {
    std::perror("echo-server");
    return 1;
  }
  std::printf("up\n");
  std::fflush(stdout);
  int fd = ::accept(listener, nullptr, nullptr);
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // 8 bytes at a time: echoed; a negative int64 -N asks for N bytes of
  // the pattern instead (the raw stream the 64 MiB transfers compare with).
  std::vector<char> bulk(static_cast<size_t>(kBulkBytes));
  for (int64_t i = 0; i < kBulkBytes; ++i) bulk[static_cast<size_t>(i)] = static_cast<char>(pattern(i));
  char buffer[8];
  for (;;) {
    if (!read_all(fd, buffer, sizeof(buffer))) return 0;
    int64_t n = 0;
    std::memcpy(&n, buffer, sizeof(n));
    if (n < 0 && -n <= kBulkBytes) {
      if (!write_all(fd, bulk.data(), static_cast<size_t>(-n))) return 1;
      continue;
    }
    if (!write_all(fd, buffer, sizeof(buffer))) return 1;
  }
}

// Seconds for the echo server to stream `size` bytes into `into`.
double raw_stream_s(int fd, char* into, int64_t size) {
  const int64_t request = -size;
  const auto t = Clock::now();
  if (!write_all(fd, reinterpret_cast<const char*>(&request), sizeof(request)) ||
      !read_all(fd, into, static_cast<size_t>(size))) {
    return -1;
  }
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Every 4093rd byte of a transfer's destination is the pattern's.
bool pattern_arrived(const char* p, int64_t size) {
  for (int64_t i = 0; i < size; i += 4093) {
    if (static_cast<uint8_t>(p[i]) != pattern(i)) return false;
  }
  return true;
}

std::string joined(const std::vector<double>& v) {
  std::string out;
  for (double x : v) absl::StrAppend(&out, out.empty() ? "" : ",", absl::StrFormat("%.2f", x));
  return out;
}

std::vector<double> raw_rtt_us(int fd, int rounds) {
  std::vector<double> out;
  char buffer[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int i = 0; i < rounds; ++i) {
    const auto t = Clock::now();
    if (::write(fd, buffer, sizeof(buffer)) != 8) break;
    size_t got = 0;
    while (got < 8) {
      ssize_t n = ::read(fd, buffer + got, 8 - got);
      if (n <= 0) return out;
      got += static_cast<size_t>(n);
    }
    out.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
  }
  return out;
}

int run_controller(const std::string& agent, const std::string& echo, int rounds) {
  const size_t colon = echo.rfind(':');
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(echo.substr(colon + 1).c_str())));
  ::inet_pton(AF_INET, echo.substr(0, colon).c_str(), &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("connect to the echo server");
    return 1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  castmesh::Runtime runtime;
  castmesh::HostMeshOptions options;
  // run_cross_host_ask.sh --tls: mutual TLS with scripts/make-test-certs.sh's files.
  const char* tls_dir = std::getenv("CASTMESH_BENCH_TLS_DIR");
  const bool tls = tls_dir != nullptr && *tls_dir != '\0';
  if (tls) {
    options.ca = absl::StrCat(tls_dir, "/ca.crt");
    options.cert = absl::StrCat(tls_dir, "/controller.crt");
    options.private_key = absl::StrCat(tls_dir, "/controller.key");
  }
  auto hosts = castmesh::HostMesh::attach(runtime, {agent}, options);
  if (!hosts.ok()) {
    std::fprintf(stderr, "attach: %s\n", hosts.status().ToString().c_str());
    return 1;
  }
  const auto spawn_start = Clock::now();
  auto procs = hosts->spawn_procs(*castmesh::Shape::Create({{"procs", 1}}));
  if (!procs.ok()) {
    std::fprintf(stderr, "spawn_procs: %s\n", procs.status().ToString().c_str());
    return 1;
  }
  const double spawn_ms = std::chrono::duration<double, std::milli>(Clock::now() - spawn_start).count();
  auto echoes = procs->spawn<Echo>("echo");
  if (!echoes.ok()) return 1;
  auto short_echoes = procs->spawn<ShortEcho>("short_echo");
  if (!short_echoes.ok()) return 1;
  auto ask_us = [&](const auto& ref, int n) {
    std::vector<double> out;
    for (int i = 0; i < n; ++i) {
      const auto t = Clock::now();
      auto r = ref.ask(Ping{i}).get(absl::Seconds(30));
      if (!r.ok()) break;
      out.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
    }
    return out;
  };
  (void)raw_rtt_us(fd, rounds / 10);  // warm every path
  (void)ask_us((*echoes)[0], rounds / 10);
  (void)ask_us((*short_echoes)[0], rounds / 10);
  double raw = 1e18, ask = 1e18, short_ask = 1e18;
  for (int rep = 0; rep < 3; ++rep) {
    raw = std::min(raw, median(raw_rtt_us(fd, rounds)));
    ask = std::min(ask, median(ask_us((*echoes)[0], rounds)));
    short_ask = std::min(short_ask, median(ask_us((*short_echoes)[0], rounds)));
  }
  std::printf("cross-host (netns) 8 B round trip, best median of 3 x %d%s:\n", rounds,
              tls ? ", castmesh over mutual TLS 1.3" : "");
  std::printf("  raw TCP (C, TCP_NODELAY)      %8.1f us\n", raw);
  std::printf("  castmesh ask (plain thread)   %8.1f us   %.2fx raw\n", ask, ask / raw);
  std::printf("  the same, kShortHandlers echo %8.1f us   %.2fx raw\n", short_ask, short_ask / raw);
  std::printf("  spawn_procs (1 proc, C++ worker) %6.1f ms\n", spawn_ms);
  std::fflush(stdout);

  // 64 MiB: an RDMA read over the socket from the proc, then the raw stream, alternating.
  auto owners = procs->spawn<Owner>("owner");
  if (!owners.ok()) return 1;
  auto buffer = (*owners)[0].ask(kBulkBytes).get(absl::Seconds(60));
  if (!buffer.ok()) {
    std::fprintf(stderr, "register: %s\n", buffer.status().ToString().c_str());
    return 1;
  }
  castmesh::TensorView local = castmesh::TensorView::Allocate(castmesh::DType::kUInt8, {kBulkBytes});
  std::memset(local.data(), 0, static_cast<size_t>(kBulkBytes));  // prefaulted, as the raw side's
  std::vector<char> raw_into(static_cast<size_t>(kBulkBytes), 0);
  std::vector<double> rdma_gbps, raw_gbps, receiver_cpu_ms, sender_cpu_ms;
  auto owner_cpu_us = [&]() -> int64_t {
    auto cpu = (*owners)[0].ask(CpuQuery{}).get(absl::Seconds(30));
    return cpu.ok() ? *cpu : -1;
  };
  for (int run = -1; run < kBulkRuns; ++run) {  // run -1 warms both paths
    std::memset(local.data(), 0, 4096);
    const int64_t sender_before = owner_cpu_us(), receiver_before = process_cpu_us();
    const auto t = Clock::now();
    auto read = buffer->read_into(local).get(absl::Seconds(120));
    const double s = std::chrono::duration<double>(Clock::now() - t).count();
    const int64_t receiver_after = process_cpu_us(), sender_after = owner_cpu_us();
    if (!read.ok() || read->transport != castmesh::RdmaTransport::kSocket ||
        !pattern_arrived(static_cast<const char*>(local.data()), kBulkBytes)) {
      std::fprintf(stderr, "64 MiB read: %s\n",
                   !read.ok() ? read.status().ToString().c_str()
                   : read->transport != castmesh::RdmaTransport::kSocket
                       ? std::string(castmesh::rdma_transport_name(read->transport)).c_str()
                       : "wrong bytes");
      return 1;
    }
    raw_into[0] = 0;
    const double raw_s = raw_stream_s(fd, raw_into.data(), kBulkBytes);
    if (raw_s < 0 || !pattern_arrived(raw_into.data(), kBulkBytes)) {
      std::fprintf(stderr, "raw 64 MiB stream failed\n");
      return 1;
    }
    if (run < 0) continue;
    rdma_gbps.push_back(static_cast<double>(kBulkBytes) / s / 1e9);
    receiver_cpu_ms.push_back(static_cast<double>(receiver_after - receiver_before) / 1e3);
    sender_cpu_ms.push_back(static_cast<double>(sender_after - sender_before) / 1e3);
    raw_gbps.push_back(static_cast<double>(kBulkBytes) / raw_s / 1e9);
  }
  std::printf("64 MiB between the hosts (GB/s = 1e9 B/s), %d runs each, median (best):\n", kBulkRuns);
  std::printf("  raw TCP stream (C)            %8.2f (%.2f)   runs %s\n", median(raw_gbps),
              *std::max_element(raw_gbps.begin(), raw_gbps.end()), joined(raw_gbps).c_str());
  std::printf("  castmesh RdmaBuffer read_into %8.2f (%.2f)   runs %s\n", median(rdma_gbps),
              *std::max_element(rdma_gbps.begin(), rdma_gbps.end()), joined(rdma_gbps).c_str());
  // CPU time per read, which contention for the cores stretches far less
  // than wall time: the busier side's bounds the read on cores of its own.
  const double busier_ms = std::max(median(receiver_cpu_ms), median(sender_cpu_ms));
  std::printf("  CPU per read, median: receiver (this proc) %.1f ms, sender (the owner's proc) %.1f ms: "
              "%.2f GB/s with a core each\n",
              median(receiver_cpu_ms), median(sender_cpu_ms), static_cast<double>(kBulkBytes) / busier_ms / 1e6);
  std::printf("RESULT mode=%s raw_rtt_us=%.1f ask_us=%.1f short_ask_us=%.1f raw_gbps=%.2f rdma_gbps=%.2f rdma_best_gbps=%.2f "
              "receiver_cpu_ms=%.1f sender_cpu_ms=%.1f cpu_bound_gbps=%.2f\n",
              tls ? "tls" : "plain", raw, ask, short_ask, median(raw_gbps), median(rdma_gbps),
              *std::max_element(rdma_gbps.begin(), rdma_gbps.end()), median(receiver_cpu_ms), median(sender_cpu_ms),
              static_cast<double>(kBulkBytes) / busier_ms / 1e6);
  std::fflush(stdout);
  ::close(fd);
  (void)procs->stop();
  (void)hosts->shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  castmesh::init(argc, argv);  // the agent's proc never returns from here
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "echo-server" && argc == 4) return serve_echo(argv[2], std::atoi(argv[3]));
  int rounds = 0;
  if (mode == "controller" && argc == 5 && absl::SimpleAtoi(argv[4], &rounds) && rounds > 10) {
    return run_controller(argv[2], argv[3], rounds);
  }
  std::fprintf(stderr, "usage: %s echo-server HOST PORT | controller AGENT HOST:PORT ROUNDS\n", argv[0]);
  return 2;
}
