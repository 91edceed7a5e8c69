// Message types: small integer type ids for dispatch, and codecs that carry a
// message across a process boundary.
//
// In one process messages are moved, never serialized. A message that crosses
// processes needs a codec: protobuf messages (anything with SerializeToString,
// ParseFromString and GetTypeName, i.e. google::protobuf::MessageLite) get one
// automatically; other types register one with CASTMESH_REGISTER_MESSAGE.
// Arithmetic types, std::string, castmesh::Unit and absl::Status-less replies
// have built-in codecs. All functions here are thread-safe.
#pragma once

#include <absl/status/status.h>

#include <concepts>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace castmesh {

// The reply of a handler that returns void or absl::Status.
struct Unit {
  friend bool operator==(Unit, Unit) = default;
};

namespace detail {
struct Envelope;

// Registers (or finds) the id of a C++ type by its compiler-spelled name, so
// every shared object of the process agrees on the id. Ids start at 1.
uint32_t register_type(std::string_view pretty_name);
// The C++ name of a type id ("" if unknown).
std::string_view type_name_of(uint32_t id);

template <typename T>
constexpr std::string_view pretty_type_name() {
  std::string_view p = __PRETTY_FUNCTION__;
  const auto start = p.find("T = ") + 4;
  const auto end = p.find_first_of(";]", start);
  return p.substr(start, end - start);
}
}  // namespace detail

// The dispatch id of T (decayed), assigned once per type on first use.
template <typename T>
uint32_t type_id() {
  static const uint32_t id = detail::register_type(detail::pretty_type_name<std::decay_t<T>>());
  return id;
}

// The C++ name of T, as used in error messages.
template <typename T>
std::string_view type_name() {
  return detail::pretty_type_name<std::decay_t<T>>();
}

// How a message type crosses a process boundary. Functions work on a T
// behind a void*; `wire_name` is the name the receiving process looks up.
struct MessageCodec {
  std::string wire_name;
  absl::Status (*encode)(const void* value, std::string* out) = nullptr;
  absl::Status (*decode)(std::string_view bytes, void* value) = nullptr;
  // A heap envelope holding a default-constructed T; *payload points at it.
  detail::Envelope* (*make_envelope)(void** payload) = nullptr;
  void* (*create)() = nullptr;          // new T()
  void (*destroy)(void* value) = nullptr;  // delete (T*)value
};

// Registers the codec of a type id. Registering the same wire name for two
// different types, or two codecs for one type, keeps the first and logs.
void register_codec(uint32_t type_id, MessageCodec codec);
// The codec of a type id, or nullptr (also tries the automatic codec below).
const MessageCodec* codec_for(uint32_t type_id);
// The codec and type id of a wire name, or nullptr.
const MessageCodec* codec_for_wire_name(std::string_view wire_name, uint32_t* type_id);

// A type that is a protobuf message (duck-typed so no protobuf header is
// needed here).
template <typename T>
concept ProtobufLike = std::default_initializable<T> && requires(const T& c, T& m, std::string* s, const std::string& in) {
  { c.SerializeToString(s) } -> std::convertible_to<bool>;
  { m.ParseFromString(in) } -> std::convertible_to<bool>;
  { c.GetTypeName() };
};

namespace detail {
template <typename T>
MessageCodec make_codec(std::string wire_name, absl::Status (*enc)(const void*, std::string*),
                        absl::Status (*dec)(std::string_view, void*));

template <typename T>
bool register_protobuf_codec() {
  if constexpr (ProtobufLike<T>) {
    static const bool once = [] {
      T probe;
      register_codec(type_id<T>(),
                     make_codec<T>(
                         std::string(probe.GetTypeName()),
                         [](const void* v, std::string* out) {
                           return static_cast<const T*>(v)->SerializeToString(out)
                                      ? absl::OkStatus()
                                      : absl::InternalError("protobuf serialization failed");
                         },
                         [](std::string_view b, void* v) {
                           return static_cast<T*>(v)->ParseFromString(std::string(b))
                                      ? absl::OkStatus()
                                      : absl::InvalidArgumentError("malformed protobuf payload");
                         }));
      return true;
    }();
    return once;
  } else {
    return false;
  }
}

// Called wherever a message type may cross processes (handler tables, remote
// sends): registers the automatic codec of protobuf types.
template <typename T>
void ensure_codec() {
  register_protobuf_codec<std::decay_t<T>>();
}
}  // namespace detail

// Registers a codec for MyMsg under a wire name. `encode` is
// absl::Status(const MyMsg&, std::string*), `decode` is
// absl::Status(std::string_view, MyMsg*). Use at namespace scope in a .cc file.
#define CASTMESH_REGISTER_MESSAGE(Type, wire_name, encode_fn, decode_fn)                          \
  static const bool castmesh_codec_registered_##Type [[maybe_unused]] = [] {                      \
    ::castmesh::register_codec(                                                                   \
        ::castmesh::type_id<Type>(),                                                              \
        ::castmesh::detail::make_codec<Type>(                                                     \
            wire_name,                                                                            \
            [](const void* v, std::string* out) -> ::absl::Status {                               \
              return encode_fn(*static_cast<const Type*>(v), out);                                \
            },                                                                                    \
            [](std::string_view b, void* v) -> ::absl::Status {                                   \
              return decode_fn(b, static_cast<Type*>(v));                                         \
            }));                                                                                  \
    return true;                                                                                  \
  }()

}  // namespace castmesh

#include "castmesh/detail/envelope.h"

namespace castmesh::detail {
template <typename T>
MessageCodec make_codec(std::string wire_name, absl::Status (*enc)(const void*, std::string*),
                        absl::Status (*dec)(std::string_view, void*)) {
  MessageCodec c;
  c.wire_name = std::move(wire_name);
  c.encode = enc;
  c.decode = dec;
  c.make_envelope = [](void** payload) -> Envelope* {
    auto* e = new TypedEnvelope<T>();
    e->type_id = type_id<T>();
    *payload = &e->value;
    return e;
  };
  c.create = []() -> void* { return new T(); };
  c.destroy = [](void* v) { delete static_cast<T*>(v); };
  return c;
}
}  // namespace castmesh::detail

namespace castmesh::detail {
// Encodes / decodes one value with its type's codec (errors: no codec, or
// the codec's own error).
template <typename T>
absl::Status encode_value(const T& value, std::string* out) {
  ensure_codec<T>();
  const MessageCodec* codec = codec_for(type_id<T>());
  if (codec == nullptr) {
    return absl::FailedPreconditionError("no codec for " + std::string(type_name<T>()) +
                                         ": register one with CASTMESH_REGISTER_MESSAGE");
  }
  return codec->encode(&value, out);
}

template <typename T>
absl::Status decode_value(std::string_view bytes, T* value) {
  ensure_codec<T>();
  const MessageCodec* codec = codec_for(type_id<T>());
  if (codec == nullptr) return absl::FailedPreconditionError("no codec for " + std::string(type_name<T>()));
  return codec->decode(bytes, value);
}
}  // namespace castmesh::detail
