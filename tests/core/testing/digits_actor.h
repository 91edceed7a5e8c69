// One test actor for mesh tests whose members live in worker procs: it keeps
// the values it was cast as decimal digits, so the order of delivery is
// visible in one number. Include it from exactly one file of a test binary
// (it registers its messages and the actor, which worker procs look up by
// name).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>

#include "castmesh/actor.h"
#include "castmesh/message.h"
#include "castmesh/proc_mesh.h"
#include "core/testing/test_messages.h"

namespace castmesh::testing {

// Appends the digit `n` to the member's number.
struct Add {
  int64_t n = 0;
};
// Asks for the member's number.
struct Get {};
// Asks for the pid of the member's proc.
struct Pid {};
// Sleeps `ms` in the handler, then answers the member's number: keeps a call
// in flight.
struct Nap {
  int64_t ms = 0;
};
// The handler throws: the member fails alone in a live proc.
struct Fail {};

inline absl::Status encode_add(const Add& m, std::string* out) { return encode_decimal(m.n, out); }
inline absl::Status decode_add(std::string_view b, Add* m) { return decode_decimal(b, &m->n); }
inline absl::Status encode_nap(const Nap& m, std::string* out) { return encode_decimal(m.ms, out); }
inline absl::Status decode_nap(std::string_view b, Nap* m) { return decode_decimal(b, &m->ms); }

// The actor. Handlers run on the actor's scheduler thread, one at a time.
class Digits : public castmesh::Actor {
 public:
  void add(const Add& m) { value_ = value_ * 10 + m.n; }
  int64_t get(const Get&) { return value_; }
  int64_t pid(const Pid&) { return static_cast<int64_t>(::getpid()); }
  int64_t nap(const Nap& m) {
    std::this_thread::sleep_for(std::chrono::milliseconds(m.ms));
    return value_;
  }
  int64_t fail(const Fail&) { throw std::runtime_error("member gave up"); }
  using Handlers = castmesh::Handlers<&Digits::add, &Digits::get, &Digits::pid, &Digits::nap, &Digits::fail>;

 private:
  int64_t value_ = 0;
};

}  // namespace castmesh::testing

// The registration macros paste the type's name into identifiers, so they
// take unqualified names.
using castmesh::testing::Add;
using castmesh::testing::Digits;
using castmesh::testing::Fail;
using castmesh::testing::Get;
using castmesh::testing::Nap;
using castmesh::testing::Pid;

CASTMESH_REGISTER_MESSAGE(Add, "castmesh.test.digits.Add", castmesh::testing::encode_add, castmesh::testing::decode_add);
CASTMESH_REGISTER_MESSAGE(Get, "castmesh.test.digits.Get", castmesh::testing::encode_empty, castmesh::testing::decode_empty);
CASTMESH_REGISTER_MESSAGE(Pid, "castmesh.test.digits.Pid", castmesh::testing::encode_empty, castmesh::testing::decode_empty);
CASTMESH_REGISTER_MESSAGE(Nap, "castmesh.test.digits.Nap", castmesh::testing::encode_nap, castmesh::testing::decode_nap);
CASTMESH_REGISTER_MESSAGE(Fail, "castmesh.test.digits.Fail", castmesh::testing::encode_empty,
                          castmesh::testing::decode_empty);
CASTMESH_REGISTER_ACTOR(Digits);
