// Addresses of actors and ports. Plain data: copyable, comparable, hashable,
// printable and serializable, so an address made in one process can be sent
// to another and used there. Any thread may create, copy and compare them.
#pragma once

#include <absl/hash/hash.h>
#include <absl/status/statusor.h>

#include <compare>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace castmesh {

// Names the process (proc) that hosts an actor. The in-process default is
// "local"; the proc layer sets a unique id (see Runtime::set_proc_id).
using ProcId = std::string;

// Where an actor lives: proc, name and index within that name. Printed as
// "proc/name[index]". The name holds no '/', '[', ']' or '#'; the proc id may
// hold anything but is split at the last '/' when parsed.
struct Address {
  ProcId proc;
  std::string name;
  uint64_t index = 0;

  // "proc/name[index]".
  std::string to_string() const;
  // Inverse of to_string(); a clear InvalidArgument error on malformed text.
  static absl::StatusOr<Address> parse(std::string_view text);
  // Serialized form (today identical to to_string(); kept separate so the
  // wire form can change without touching printing).
  std::string to_bytes() const { return to_string(); }
  static absl::StatusOr<Address> from_bytes(std::string_view bytes) { return parse(bytes); }

  bool empty() const { return name.empty(); }

  friend bool operator==(const Address&, const Address&) = default;
  friend auto operator<=>(const Address&, const Address&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const Address& a) {
    return H::combine(std::move(h), a.proc, a.name, a.index);
  }
};

// A port of an actor or of a runtime: (owner address, port id). Printed as
// "proc/name[index]#port". Port id 0 is the owner's mailbox; reply ports of a
// runtime are owned by the pseudo-actor "proc/_reply[0]".
struct PortAddress {
  Address owner;
  uint64_t port = 0;

  std::string to_string() const;
  static absl::StatusOr<PortAddress> parse(std::string_view text);
  std::string to_bytes() const { return to_string(); }
  static absl::StatusOr<PortAddress> from_bytes(std::string_view bytes) { return parse(bytes); }

  friend bool operator==(const PortAddress&, const PortAddress&) = default;
  friend auto operator<=>(const PortAddress&, const PortAddress&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const PortAddress& a) {
    return H::combine(std::move(h), a.owner, a.port);
  }
};

std::ostream& operator<<(std::ostream& os, const Address& a);
std::ostream& operator<<(std::ostream& os, const PortAddress& a);

}  // namespace castmesh

template <>
struct std::hash<castmesh::Address> {
  size_t operator()(const castmesh::Address& a) const { return absl::Hash<castmesh::Address>{}(a); }
};
template <>
struct std::hash<castmesh::PortAddress> {
  size_t operator()(const castmesh::PortAddress& a) const { return absl::Hash<castmesh::PortAddress>{}(a); }
};
