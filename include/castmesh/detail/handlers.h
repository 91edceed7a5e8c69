// Internal: compile-time handler lists (castmesh::Handlers<&A::f, ...>), the
// per-class dispatch table and the thunks that call a handler and answer.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "castmesh/detail/envelope.h"
#include "castmesh/future.h"
#include "castmesh/message.h"

namespace castmesh {

// The messages an actor handles, as member-function pointers. Each handler
// takes one message (by value, const& or &&) and returns void, T,
// absl::Status, absl::StatusOr<T> or Future<T>. Declare it in the class:
//   using Handlers = castmesh::Handlers<&Counter::add, &Counter::get>;
// With two handlers for one message type, the first listed is used.
template <auto... Fs>
struct Handlers {};

namespace detail {

template <typename F>
struct MemFnTraits;
#define CASTMESH_MEMFN_TRAITS(QUALS)                           \
  template <typename C, typename R, typename Arg>              \
  struct MemFnTraits<R (C::*)(Arg) QUALS> {                    \
    using class_type = C;                                      \
    using return_type = R;                                     \
    using arg_type = Arg;                                      \
    using message_type = std::decay_t<Arg>;                    \
  };
CASTMESH_MEMFN_TRAITS()
CASTMESH_MEMFN_TRAITS(const)
CASTMESH_MEMFN_TRAITS(noexcept)
CASTMESH_MEMFN_TRAITS(const noexcept)
#undef CASTMESH_MEMFN_TRAITS

// Calls handler F of actor class A for the message in `env`, and answers
// env->reply (if any) with the handler's result.
template <typename A, auto F>
struct HandlerThunk {
  using Traits = MemFnTraits<decltype(F)>;
  using M = typename Traits::message_type;
  using R = typename Traits::return_type;
  using reply_type = resolved_t<R>;

  static void invoke(Actor* actor, Envelope* env) {
    A* self = static_cast<A*>(actor);
    M& msg = static_cast<TypedEnvelope<M>*>(env)->value;
    if constexpr (std::is_void_v<R>) {
      call(self, msg);
      if (env->reply) {
        Unit u;
        env->reply.complete_value(type_id<Unit>(), &u);
      }
    } else if constexpr (std::is_same_v<R, absl::Status>) {
      absl::Status st = call(self, msg);
      if (!env->reply) return;
      if (st.ok()) {
        Unit u;
        env->reply.complete_value(type_id<Unit>(), &u);
      } else {
        env->reply.complete_error(std::move(st));
      }
    } else if constexpr (IsStatusOr<R>::value) {
      R result = call(self, msg);
      if (!env->reply) return;
      if (result.ok()) {
        env->reply.complete_value(type_id<reply_type>(), &*result);
      } else {
        env->reply.complete_error(result.status());
      }
    } else if constexpr (IsFuture<R>::value) {
      R result = call(self, msg);
      if (!env->reply) return;
      std::move(result).on_ready([reply = std::move(env->reply)](absl::StatusOr<reply_type> v) mutable {
        if (v.ok()) {
          reply.complete_value(type_id<reply_type>(), &*v);
        } else {
          reply.complete_error(v.status());
        }
      });
    } else {
      R result = call(self, msg);
      if (env->reply) env->reply.complete_value(type_id<reply_type>(), &result);
    }
  }

  static decltype(auto) call(A* self, M& msg) {
    using Arg = typename Traits::arg_type;
    if constexpr (std::is_lvalue_reference_v<Arg>) {
      return (self->*F)(msg);
    } else {
      return (self->*F)(std::move(msg));
    }
  }
};

template <typename List>
struct HandlerList;
template <auto... Fs>
struct HandlerList<Handlers<Fs...>> {
  template <typename A>
  using thunks = std::tuple<HandlerThunk<A, Fs>...>;
};

template <typename A>
concept HasHandlers = requires { typename A::Handlers; };

template <typename A, typename Tuple, typename M>
struct FindThunk;
template <typename A, typename M>
struct FindThunk<A, std::tuple<>, M> {
  using type = void;
};
template <typename A, typename First, typename... Rest, typename M>
struct FindThunk<A, std::tuple<First, Rest...>, M> {
  using type = std::conditional_t<std::is_same_v<typename First::M, M>, First,
                                  typename FindThunk<A, std::tuple<Rest...>, M>::type>;
};

template <typename A, typename M>
struct HandlerLookup {
  static_assert(HasHandlers<A>,
                "actor class has no handler list: declare `using Handlers = castmesh::Handlers<&A::f, ...>;`");
  using type = typename FindThunk<A, typename HandlerList<typename A::Handlers>::template thunks<A>, M>::type;
  static_assert(!std::is_void_v<type>, "this actor class has no handler for this message type (see Handlers)");
};

// The thunk of A's handler for message type M (compile error if none).
template <typename A, typename M>
using HandlerFor = typename HandlerLookup<A, std::decay_t<M>>::type;

// Runtime dispatch table of an actor class: used for sends whose handler was
// not resolved at compile time (untyped refs, messages from other procs).
struct HandlerEntry {
  uint32_t type_id;
  uint32_t reply_type;
  HandlerFn fn;
};
struct HandlerTable {
  std::vector<HandlerEntry> entries;
  std::string_view class_name;
  uint32_t class_id = 0;
  // The class declares kShortHandlers (castmesh/actor.h): its remote
  // messages may run on the receiving transport thread.
  bool short_handlers = false;

  const HandlerEntry* find(uint32_t type_id) const {
    for (const auto& e : entries) {
      if (e.type_id == type_id) return &e;
    }
    return nullptr;
  }
};

template <typename A, typename... Thunks>
void fill_table(HandlerTable& t, std::tuple<Thunks...>*) {
  (t.entries.push_back({type_id<typename Thunks::M>(), type_id<typename Thunks::reply_type>(), &Thunks::invoke}), ...);
  (ensure_codec<typename Thunks::M>(), ...);
  (ensure_codec<typename Thunks::reply_type>(), ...);
}

template <typename A>
const HandlerTable& handler_table() {
  static const HandlerTable table = [] {
    HandlerTable t;
    t.class_name = type_name<A>();
    t.class_id = type_id<A>();
    if constexpr (requires { A::kShortHandlers; }) t.short_handlers = A::kShortHandlers;
    if constexpr (HasHandlers<A>) {
      using Tuple = typename HandlerList<typename A::Handlers>::template thunks<A>;
      fill_table<A>(t, static_cast<Tuple*>(nullptr));
    }
    return t;
  }();
  return table;
}

}  // namespace detail
}  // namespace castmesh
