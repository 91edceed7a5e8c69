// libFuzzer harness: a real proc (Runtime + ProcHost, so a real Endpoint)
// fed over a Unix socket, before and after the handshake.
//
// Input: byte 0 picks the mode. Even: the rest is sent raw from the first
// byte on (the acceptor's handshake parser). Odd: the harness authenticates
// with the mesh secret first, then sends records
//   [u8 type][u8 flags][u16_le size][size bytes of payload]
// each as one frame header with a correct sequence number: `type` picks a
// control message (the proc's control handlers: join, spawn, supervision,
// monitors, cast relay, collectives, ...) or an actor message, and its high
// bit sends the record's bytes raw instead (frame errors after the handshake).
// After the input the harness half-closes and waits for the proc to close.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "castmesh/runtime.h"
#include "castmesh/wire/v1/frame.pb.h"
#include "core/proc/proc_host.h"
#include "core/transport/address.h"
#include "core/wire/frame.h"
#include "core/wire/handshake.h"

namespace {

namespace v1 = castmesh::wire::v1;
namespace wire = castmesh::wire;

constexpr char kSecret[] = "fuzz-mesh-secret";
constexpr char kFuzzPeer[] = "unix:@castmesh-fuzz-peer";

// Every message type a proc's control handlers may be given (proto/castmesh/wire/v1).
const char* const kControlTypes[] = {
    "castmesh.wire.v1.Join",          "castmesh.wire.v1.JoinReply",     "castmesh.wire.v1.SpawnRequest",
    "castmesh.wire.v1.SpawnReply",    "castmesh.wire.v1.Supervision",   "castmesh.wire.v1.Monitor",
    "castmesh.wire.v1.ActorDown",     "castmesh.wire.v1.CastMeshSetup", "castmesh.wire.v1.CastMeshSetupReply",
    "castmesh.wire.v1.CastMeshDrop",  "castmesh.wire.v1.CastHop",       "castmesh.wire.v1.CastPiece",
    "castmesh.wire.v1.CastReply",     "castmesh.wire.v1.CollectiveHeader", "castmesh.wire.v1.WorldJoin",
    "castmesh.wire.v1.WorldRoster",
    // Data messages (frame header flag 2, ProcHost::send_data): the data header inside the frame header + a raw body.
    "castmesh.collectives.v1",        "castmesh.collectives.link.v1", "castmesh.rdma.v1",
};
constexpr std::size_t kControlCount = sizeof(kControlTypes) / sizeof(kControlTypes[0]);

// The proc under test, made once per process.
struct Proc {
  castmesh::Runtime runtime;
  std::shared_ptr<castmesh::proc::ProcHost> host;
  std::string name;  // abstract socket name
};

Proc& proc() {
  static Proc* p = [] {
    auto* made = new Proc;
    castmesh::proc::ProcHostOptions options;
    options.listen = "unix:@castmesh-fuzz-" + std::to_string(::getpid());
    options.secret = kSecret;
    auto host = castmesh::proc::ProcHost::attach(made->runtime, options);
    if (!host.ok()) std::abort();
    made->host = *host;
    made->name = options.listen.substr(6);  // after "unix:@"
    return made;
  }();
  return *p;
}

int connect_to(const std::string& abstract_name) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path + 1, abstract_name.data(), abstract_name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + abstract_name.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0) std::abort();
  return fd;
}

bool send_all(int fd, const std::string& bytes) {
  for (std::size_t off = 0; off < bytes.size();) {
    const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;  // the proc closed the connection: fine
    off += static_cast<std::size_t>(n);
  }
  return true;
}

bool read_body(int fd, std::string& body) {
  auto read_exact = [fd](char* out, std::size_t n) {
    for (std::size_t got = 0; got < n;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) return false;
      const ssize_t r = ::recv(fd, out + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<std::size_t>(r);
    }
    return true;
  };
  char prefix[wire::kLengthPrefixSize];
  if (!read_exact(prefix, sizeof(prefix))) return false;
  body.resize(wire::read_length_prefix(prefix));
  return read_exact(body.data(), body.size());
}

bool authenticate(int fd) {
  std::string body;
  if (!read_body(fd, body)) return false;
  auto challenge = wire::parse_handshake(body.data(), body.size());
  if (!challenge.ok() || !challenge->has_challenge()) std::abort();  // the proc's own challenge
  const std::string nonce = wire::make_nonce();
  v1::Handshake reply;
  reply.mutable_response()->set_version(wire::kWireVersion);
  reply.mutable_response()->set_nonce(nonce);
  reply.mutable_response()->set_proc(kFuzzPeer);
  reply.mutable_response()->set_mac(wire::connector_mac(kSecret, challenge->challenge().nonce(), nonce, kFuzzPeer));
  std::string frame;
  wire::append_frame_body(reply, frame);
  return send_all(fd, frame) && read_body(fd, body);
}

// The records of an odd-mode input as frames.
std::string frames_from(const std::uint8_t* data, std::size_t size, const std::string& proc_id) {
  std::string out;
  std::uint64_t sequence = 1;
  std::size_t at = 0;
  while (size - at >= 4) {
    const std::uint8_t type = data[at];
    const std::uint8_t flags = data[at + 1];
    std::size_t length = data[at + 2] | (std::size_t{data[at + 3]} << 8);
    at += 4;
    length = std::min(length, size - at);
    std::string payload(reinterpret_cast<const char*>(data + at), length);
    at += length;
    if (type & 0x80) {
      out += payload;
      continue;
    }
    v1::FrameHeader frame_header;
    frame_header.set_version(wire::kWireVersion);
    frame_header.set_sequence(sequence++);
    frame_header.set_correlation(type + 1);
    frame_header.set_flags(flags);
    if (flags & 2) {  // a data message: the record's first half is the service's header
      frame_header.set_data_header(payload.substr(0, payload.size() / 2));
      payload.erase(0, payload.size() / 2);
    }
    frame_header.set_payload_size(payload.size());
    if (type % (kControlCount + 1) < kControlCount) {
      frame_header.set_kind(v1::FrameHeader::KIND_CONTROL);
      frame_header.set_message_type(kControlTypes[type % (kControlCount + 1)]);
    } else {
      frame_header.set_kind(v1::FrameHeader::KIND_MESSAGE);
      frame_header.set_destination(proc_id + "/target[" + std::to_string(flags) + "]");
      frame_header.set_message_type("std::string");
      frame_header.set_reply_to(std::string(kFuzzPeer) + "/caller[0]#1");
      frame_header.set_port(flags & 1);
    }
    wire::append_frame_body(frame_header, out);
    out += payload;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  Proc& p = proc();
  const int fd = connect_to(p.name);
  const bool authenticated = (data[0] & 1) != 0;
  bool open = true;
  if (authenticated) {
    open = authenticate(fd) && send_all(fd, frames_from(data + 1, size - 1, p.host->id()));
  } else {
    open = send_all(fd, std::string(reinterpret_cast<const char*>(data + 1), size - 1));
  }
  // Half-close, then wait (bounded) until the proc closes its side too, so
  // that each input is done with before the next.
  ::shutdown(fd, SHUT_WR);
  char buf[4096];
  for (int rounds = 0; open && rounds < 200; ++rounds) {
    pollfd q{fd, POLLIN, 0};
    if (::poll(&q, 1, 10) <= 0) continue;
    if (::recv(fd, buf, sizeof(buf), 0) <= 0) break;
  }
  ::close(fd);
  return 0;
}
