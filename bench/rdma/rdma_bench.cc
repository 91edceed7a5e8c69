// RdmaBuffer read_into / write_from between two procs of this host, with
// the limits measured in the same run beside them:
//   memcpy        single-thread memcpy of the same size (prefaulted buffers)
//   raw socket    a Unix stream socket between two processes: one writes
//                 the bytes, the other reads them into its buffer (the
//                 socket path's ceiling); for 4 KiB, the round trip of a
//                 small request answered with 4 KiB (the read's ceiling)
// castmesh runs over same-host single copy (process_vm_readv/writev: one-sided
// through the owner's registration table, or with a lease per operation when
// CASTMESH_RDMA_ONE_SIDED=0 is set around the run), a
// shared segment (CASTMESH_RDMA_SINGLE_COPY=0: what a host that refuses
// cross-memory attach gets) and the proc socket (also
// CASTMESH_RDMA_SHARED_SEGMENT=0), chunk size default.
//
// usage: rdma_bench [--sizes=4K,1M,64M,1G] [--quick] [--device]
// Prints one table; every castmesh transfer's bytes are checked.
// --device: the owner's buffer and this proc's destination and source are
// CUDA/ROCm memory (device 0; the tensor_engine backend must load), so both
// sides stage through host memory (docs/rdma.md "Device memory"); the
// single-copy columns then show the shared segment, which device buffers use
// instead.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "castmesh/castmesh.h"
#include "castmesh/config.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/rdma.h"
#include "castmesh/tensor_engine.h"

namespace {

using castmesh::DType;
using castmesh::RdmaBuffer;
using castmesh::TensorView;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

const castmesh::Device kGpu{castmesh::DeviceKind::kCuda, 0};

// Copies `from` into `to` (one of them device memory) and waits.
absl::Status copy_now(const TensorView& to, const TensorView& from, castmesh::Device device) {
  absl::StatusOr<castmesh::DeviceStream> stream = castmesh::DeviceStream::Create(device);
  if (!stream.ok()) return stream.status();
  if (absl::Status st = castmesh::device_copy(to, from, *stream); !st.ok()) return st;
  return stream->synchronize();
}

// Owns one buffer per size, byte i = i * 7; a negative size: -size bytes of device memory.
class Owner : public castmesh::Actor {
 public:
  absl::StatusOr<RdmaBuffer> make(int64_t size) {
    const bool device = size < 0;
    size = std::abs(size);
    TensorView host = TensorView::Allocate(DType::kUInt8, {size});
    auto* p = static_cast<uint8_t*>(host.data());
    for (int64_t i = 0; i < size; ++i) p[i] = static_cast<uint8_t>(i * 7);
    if (device) {
      absl::StatusOr<TensorView> on_device = castmesh::device_empty(DType::kUInt8, {size}, kGpu);
      if (!on_device.ok()) return on_device.status();
      if (absl::Status st = copy_now(*on_device, host, kGpu); !st.ok()) return st;
      host = *on_device;
    }
    memory_.push_back(host);
    return RdmaBuffer::register_memory(memory_.back());
  }
  using Handlers = castmesh::Handlers<&Owner::make>;

 private:
  std::vector<TensorView> memory_;
};

}  // namespace

CASTMESH_REGISTER_ACTOR(Owner);

namespace {

// The raw-socket peer: a child process that, per command (8 bytes: a size,
// negative = answer one -size-byte message per 1-byte request, `count`
// times), streams or answers over a Unix socket.
struct SocketPeer {
  int fd = -1;
  pid_t pid = 0;
};

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) ::_exit(1);
    p += w;
    n -= static_cast<size_t>(w);
  }
}
void read_all(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) ::_exit(1);
    p += r;
    n -= static_cast<size_t>(r);
  }
}

SocketPeer start_socket_peer(size_t max_bytes) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::abort();
  const pid_t pid = ::fork();
  if (pid == 0) {  // before any castmesh thread exists: a plain loop
    ::close(fds[0]);
    std::vector<char> data(max_bytes, 'x');
    int64_t command[2];
    for (;;) {
      read_all(fds[1], reinterpret_cast<char*>(command), sizeof command);
      if (command[0] == 0) ::_exit(0);
      if (command[0] > 0) {
        write_all(fds[1], data.data(), static_cast<size_t>(command[0]));
        continue;
      }
      for (int64_t i = 0; i < command[1]; ++i) {
        char request;
        read_all(fds[1], &request, 1);
        write_all(fds[1], data.data(), static_cast<size_t>(-command[0]));
      }
    }
  }
  ::close(fds[1]);
  return SocketPeer{fds[0], pid};
}

// Seconds for the peer to stream `size` bytes into `into`.
double raw_stream(const SocketPeer& peer, char* into, size_t size) {
  const int64_t command[2] = {static_cast<int64_t>(size), 0};
  const auto start = Clock::now();
  write_all(peer.fd, reinterpret_cast<const char*>(command), sizeof command);
  read_all(peer.fd, into, size);
  return seconds_since(start);
}

// Seconds per round trip of a 1-byte request answered with `size` bytes.
double raw_round_trip(const SocketPeer& peer, char* into, size_t size, int count) {
  const int64_t command[2] = {-static_cast<int64_t>(size), count};
  write_all(peer.fd, reinterpret_cast<const char*>(command), sizeof command);
  const auto start = Clock::now();
  for (int i = 0; i < count; ++i) {
    write_all(peer.fd, "r", 1);
    read_all(peer.fd, into, size);
  }
  return seconds_since(start) / count;
}

double memcpy_seconds(char* dst, const char* src, size_t size) {
  const auto start = Clock::now();
  std::memcpy(dst, src, size);
  return seconds_since(start);
}

// Best (lowest) seconds of `reps` runs of f; f returns its own seconds.
template <typename F>
double best_of(int reps, F f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) best = std::min(best, f());
  return best;
}

double castmesh_op(const RdmaBuffer& buffer, TensorView& local, bool write) {
  const auto start = Clock::now();
  auto done = write ? buffer.write_from(local).get(absl::Seconds(120)) : buffer.read_into(local).get(absl::Seconds(120));
  const double s = seconds_since(start);
  if (!done.ok()) {
    std::fprintf(stderr, "castmesh %s failed: %s\n", write ? "write" : "read", done.status().ToString().c_str());
    std::exit(1);
  }
  return s;
}

void check_read(TensorView local) {
  if (local.device() == kGpu) {
    TensorView host = TensorView::Allocate(DType::kUInt8, {local.numel()});
    if (!copy_now(host, local, kGpu).ok()) std::exit(1);
    local = host;
  }
  const auto* p = static_cast<const uint8_t*>(local.data());
  for (int64_t i = 0; i < local.numel(); i += 4093) {
    if (p[i] != static_cast<uint8_t>(i * 7)) {
      std::fprintf(stderr, "wrong byte %lld after a read\n", static_cast<long long>(i));
      std::exit(1);
    }
  }
}

std::vector<size_t> parse_sizes(const std::string& text) {
  std::vector<size_t> sizes;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    size_t scale = 1;
    if (!part.empty() && (part.back() == 'K' || part.back() == 'M' || part.back() == 'G')) {
      scale = part.back() == 'K' ? 1024 : part.back() == 'M' ? 1 << 20 : 1 << 30;
      part.remove_suffix(1);
    }
    size_t n = 0;
    if (!absl::SimpleAtoi(part, &n)) {
      std::fprintf(stderr, "bad size '%s'\n", std::string(part).c_str());
      std::exit(2);
    }
    sizes.push_back(n * scale);
  }
  return sizes;
}

double gbps(size_t bytes, double s) { return static_cast<double>(bytes) / s / 1e9; }

}  // namespace

int main(int argc, char** argv) {
  castmesh::init(argc, argv);  // the worker proc never returns from here
  std::string size_text = "4K,1M,64M,1G";
  bool quick = false;
  bool device = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--sizes=", 0) == 0) size_text = arg.substr(8);
    else if (arg == "--quick") quick = true;
    else if (arg == "--device") device = true;
  }
  const std::vector<size_t> sizes = parse_sizes(size_text);
  const size_t max_size = *std::max_element(sizes.begin(), sizes.end());
  SocketPeer peer = start_socket_peer(max_size);

  castmesh::Runtime runtime;
  auto procs = castmesh::LocalAllocator().allocate(runtime, 1);
  if (!procs.ok()) {
    std::fprintf(stderr, "allocate: %s\n", procs.status().ToString().c_str());
    return 1;
  }
  auto owners = procs->spawn<Owner>("owner");
  if (!owners.ok()) return 1;

  std::printf("RdmaBuffer between two procs of this host (best of N; GB/s = 1e9 bytes/s)%s\n",
              device ? ", device memory on both sides (cuda:0, staged; 'sc' columns: the shared segment)" : "");
  std::printf("%8s | %9s %9s | %9s %9s %6s | %9s %9s %6s | %9s %9s %6s | %s\n", "size", "memcpy", "raw sock",
              "sc read", "sc write", "/memcpy", "seg read", "seg write", "/memcpy", "sock read", "sockwrite", "/raw",
              "latency (4K: us)");
  for (size_t size : sizes) {
    const int reps = quick ? 2 : size <= 4096 ? 2000 : size <= (1 << 20) ? 100 : size <= (64 << 20) ? 8 : 3;
    auto made = owners->at(0).ask(device ? -static_cast<int64_t>(size) : static_cast<int64_t>(size))
                    .get(absl::Seconds(120));
    if (!made.ok()) {
      std::fprintf(stderr, "make: %s\n", made.status().ToString().c_str());
      return 1;
    }
    TensorView local = TensorView::Allocate(DType::kUInt8, {static_cast<int64_t>(size)});
    TensorView src = TensorView::Allocate(DType::kUInt8, {static_cast<int64_t>(size)});
    std::memset(local.data(), 1, size);
    std::memset(src.data(), 2, size);
    const TensorView host_local = local;  // the raw socket's destination, also in --device runs
    auto* dst = static_cast<char*>(host_local.data());
    const double t_memcpy = best_of(reps, [&] { return memcpy_seconds(dst, static_cast<char*>(src.data()), size); });
    const double t_raw = best_of(reps, [&] { return raw_stream(peer, dst, size); });
    if (device) {  // the castmesh transfers move device memory from here on
      for (TensorView* side : {&local, &src}) {
        absl::StatusOr<TensorView> on_device = castmesh::device_empty(DType::kUInt8, {static_cast<int64_t>(size)}, kGpu);
        if (!on_device.ok() || !copy_now(*on_device, *side, kGpu).ok()) {
          std::fprintf(stderr, "device memory: %s\n", on_device.status().ToString().c_str());
          return 1;
        }
        *side = *on_device;
      }
    }
    double t[3][2];  // [path: single copy, shared segment, socket][write?]
    for (int write = 0; write < 2; ++write) {  // every read before the writes change the bytes
      for (int path = 0; path < 3; ++path) {
        // The requesting process picks the path per operation (castmesh/config.h's runtime layer).
        (void)castmesh::config::configure({{"rdma_single_copy", path == 0 ? "1" : "0"},
                                           {"rdma_shared_segment", path == 2 ? "0" : "1"}});
        if (!device) std::memset(local.data(), 1, size);
        t[path][write] = best_of(reps, [&] { return castmesh_op(*made, write ? src : local, write); });
        if (!write) check_read(local);
      }
    }
    castmesh::config::clear_runtime_config();
    std::string latency;
    if (size <= 4096) {
      const double rtt = raw_round_trip(peer, dst, size, quick ? 10 : 2000);
      // "read": the default same-host path (one-sided unless CASTMESH_RDMA_ONE_SIDED=0, then the
      // socket's request and answer, as below 64 KiB before one-sided copies); "sock": the socket path.
      latency = "raw rtt " + std::to_string(rtt * 1e6).substr(0, 5) + ", read " +
                std::to_string(t[0][0] * 1e6).substr(0, 5) + " (" + std::to_string(t[0][0] / rtt).substr(0, 4) +
                "x), sock read " + std::to_string(t[2][0] * 1e6).substr(0, 5) + " (" +
                std::to_string(t[2][0] / rtt).substr(0, 4) + "x)";
    }
    const char* unit = size >= (1 << 30) ? "G" : size >= (1 << 20) ? "M" : "K";
    const size_t shown = size >= (1 << 30) ? size >> 30 : size >= (1 << 20) ? size >> 20 : size >> 10;
    std::printf("%6zu%s  | %9.2f %9.2f | %9.2f %9.2f %6.2f | %9.2f %9.2f %6.2f | %9.2f %9.2f %6.2f | %s\n", shown,
                unit, gbps(size, t_memcpy), gbps(size, t_raw), gbps(size, t[0][0]), gbps(size, t[0][1]),
                t_memcpy / t[0][0], gbps(size, t[1][0]), gbps(size, t[1][1]), t_memcpy / t[1][0],
                gbps(size, t[2][0]), gbps(size, t[2][1]), t_raw / t[2][0], latency.c_str());
    std::fflush(stdout);
    (void)made->release().get(absl::Seconds(30));
  }
  const int64_t stop[2] = {0, 0};
  write_all(peer.fd, reinterpret_cast<const char*>(stop), sizeof stop);
  ::waitpid(peer.pid, nullptr, 0);
  (void)procs->stop();
  return 0;
}
