// Type ids and codecs. Type ids are keyed by the compiler-spelled type name
// so every shared object of the process gets the same id for a type.
#include <absl/container/flat_hash_map.h>
#include "core/actor/text.h"
#include <absl/synchronization/mutex.h>

#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "castmesh/message.h"
#include "core/log/log.h"

namespace castmesh {
using detail::str_cat;
namespace {

struct Registry {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, uint32_t> ids ABSL_GUARDED_BY(mu);
  std::deque<std::string> names ABSL_GUARDED_BY(mu);  // index id-1; deque keeps views stable
  std::vector<std::unique_ptr<MessageCodec>> codecs ABSL_GUARDED_BY(mu);  // index id
  absl::flat_hash_map<std::string, uint32_t> wire_names ABSL_GUARDED_BY(mu);
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: used during static destruction
  return *r;
}

template <typename T>
MessageCodec arithmetic_codec(std::string wire_name) {
  return detail::make_codec<T>(
      std::move(wire_name),
      [](const void* v, std::string* out) {
        out->assign(reinterpret_cast<const char*>(v), sizeof(T));
        return absl::OkStatus();
      },
      [](std::string_view b, void* v) {
        if (b.size() != sizeof(T)) return absl::InvalidArgumentError("wrong payload size for an arithmetic value");
        std::memcpy(v, b.data(), sizeof(T));
        return absl::OkStatus();
      });
}

// Built-in codecs (host byte order; all supported hosts are little-endian).
const bool kBuiltins [[maybe_unused]] = [] {
  register_codec(type_id<bool>(), arithmetic_codec<bool>("castmesh.bool"));
  register_codec(type_id<int8_t>(), arithmetic_codec<int8_t>("castmesh.i8"));
  register_codec(type_id<int16_t>(), arithmetic_codec<int16_t>("castmesh.i16"));
  register_codec(type_id<int32_t>(), arithmetic_codec<int32_t>("castmesh.i32"));
  register_codec(type_id<int64_t>(), arithmetic_codec<int64_t>("castmesh.i64"));
  register_codec(type_id<uint8_t>(), arithmetic_codec<uint8_t>("castmesh.u8"));
  register_codec(type_id<uint16_t>(), arithmetic_codec<uint16_t>("castmesh.u16"));
  register_codec(type_id<uint32_t>(), arithmetic_codec<uint32_t>("castmesh.u32"));
  register_codec(type_id<uint64_t>(), arithmetic_codec<uint64_t>("castmesh.u64"));
  register_codec(type_id<float>(), arithmetic_codec<float>("castmesh.f32"));
  register_codec(type_id<double>(), arithmetic_codec<double>("castmesh.f64"));
  register_codec(type_id<std::string>(),
                 detail::make_codec<std::string>(
                     "castmesh.string",
                     [](const void* v, std::string* out) {
                       *out = *static_cast<const std::string*>(v);
                       return absl::OkStatus();
                     },
                     [](std::string_view b, void* v) {
                       static_cast<std::string*>(v)->assign(b);
                       return absl::OkStatus();
                     }));
  register_codec(type_id<Unit>(), detail::make_codec<Unit>(
                                      "castmesh.Unit",
                                      [](const void*, std::string* out) {
                                        out->clear();
                                        return absl::OkStatus();
                                      },
                                      [](std::string_view, void*) { return absl::OkStatus(); }));
  return true;
}();

}  // namespace

namespace detail {

uint32_t register_type(std::string_view pretty_name) {
  Registry& r = registry();
  absl::MutexLock lock(&r.mu);
  auto [it, inserted] = r.ids.try_emplace(std::string(pretty_name), 0);
  if (inserted) {
    r.names.emplace_back(pretty_name);
    it->second = static_cast<uint32_t>(r.names.size());
  }
  return it->second;
}

std::string_view type_name_of(uint32_t id) {
  Registry& r = registry();
  absl::MutexLock lock(&r.mu);
  if (id == 0 || id > r.names.size()) return {};
  return r.names[id - 1];
}

}  // namespace detail

void register_codec(uint32_t type_id, MessageCodec codec) {
  Registry& r = registry();
  absl::MutexLock lock(&r.mu);
  if (r.codecs.size() <= type_id) r.codecs.resize(type_id + 1);
  if (r.codecs[type_id]) {
    if (r.codecs[type_id]->wire_name != codec.wire_name) {
      CASTMESH_LOG_WARN("message type {} already has codec '{}'; ignoring codec '{}'",
                        type_id <= r.names.size() ? r.names[type_id - 1] : "?", r.codecs[type_id]->wire_name,
                        codec.wire_name);
    }
    return;
  }
  auto [it, inserted] = r.wire_names.try_emplace(codec.wire_name, type_id);
  if (!inserted && it->second != type_id) {
    CASTMESH_LOG_WARN("wire name '{}' already names another message type; codec ignored", codec.wire_name);
    return;
  }
  r.codecs[type_id] = std::make_unique<MessageCodec>(std::move(codec));
}

const MessageCodec* codec_for(uint32_t type_id) {
  Registry& r = registry();
  absl::MutexLock lock(&r.mu);
  if (type_id >= r.codecs.size()) return nullptr;
  return r.codecs[type_id].get();
}

const MessageCodec* codec_for_wire_name(std::string_view wire_name, uint32_t* type_id) {
  Registry& r = registry();
  absl::MutexLock lock(&r.mu);
  auto it = r.wire_names.find(detail::av(wire_name));
  if (it == r.wire_names.end()) return nullptr;
  if (type_id) *type_id = it->second;
  return r.codecs[it->second].get();
}

}  // namespace castmesh
