// Future<T>: the result of a request, resolving to absl::StatusOr<T> so a dead
// actor, a timeout or a remote error is a value, never a hang.
//
// A Future is move-only and has one consumer: get(), then() or on_ready().
// Any thread may use it. Blocking get() is for plain (non-actor) threads and
// dedicated-thread actors; inside a pooled actor use Actor::on_complete (runs
// the continuation inside the actor) or return the Future from the handler.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/time/clock.h>
#include <absl/time/time.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "castmesh/detail/future_state.h"
#include "castmesh/detail/mutex.h"

namespace castmesh {

template <typename T>
class Future;

namespace detail {
template <typename T>
struct IsFuture : std::false_type {};
template <typename T>
struct IsFuture<Future<T>> : std::true_type {
  using value_type = T;
};
template <typename T>
struct IsStatusOr : std::false_type {};
template <typename T>
struct IsStatusOr<absl::StatusOr<T>> : std::true_type {
  using value_type = T;
};

// The value type a callable's result resolves to: void/Status -> Unit,
// StatusOr<U> -> U, Future<U> -> U, U -> U.
template <typename R>
struct ResolvedType {
  using type = R;
};
template <>
struct ResolvedType<void> {
  using type = Unit;
};
template <>
struct ResolvedType<absl::Status> {
  using type = Unit;
};
template <typename U>
struct ResolvedType<absl::StatusOr<U>> {
  using type = U;
};
template <typename U>
struct ResolvedType<Future<U>> {
  using type = U;
};
template <typename R>
using resolved_t = typename ResolvedType<R>::type;
}  // namespace detail

template <typename T>
class [[nodiscard]] Future {
  static_assert(!std::is_void_v<T>, "use Future<castmesh::Unit> for a value-less result");

 public:
  using value_type = T;

  Future() = default;
  // Adopts one reference of `state`.
  explicit Future(detail::FutureState<T>* state) : state_(state) {}
  Future(Future&& o) noexcept : state_(std::exchange(o.state_, nullptr)) {}
  Future& operator=(Future&& o) noexcept {
    if (this != &o) {
      release();
      state_ = std::exchange(o.state_, nullptr);
    }
    return *this;
  }
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;
  ~Future() { release(); }

  // False for a default-constructed or consumed future.
  bool valid() const { return state_ != nullptr; }
  // True once the result is available (get() will not block).
  bool ready() const { return state_ && state_->is_ready(); }

  // Blocks until the result is available and moves it out.
  absl::StatusOr<T> get() { return get_until(absl::InfiniteFuture()); }
  // Waits at most `timeout`: kDeadlineExceeded if the result is not there
  // yet (the future stays valid and can be waited on again).
  absl::StatusOr<T> get(absl::Duration timeout) { return get_until(absl::Now() + timeout); }
  template <typename Rep, typename Period>
  absl::StatusOr<T> get(std::chrono::duration<Rep, Period> timeout) {
    return get(absl::FromChrono(timeout));
  }
  absl::StatusOr<T> get_until(absl::Time deadline) {
    if (!state_) return absl::FailedPreconditionError("invalid future (empty or already consumed)");
    if (!state_->wait(deadline)) return absl::DeadlineExceededError("future not ready before the deadline");
    absl::StatusOr<T> out = state_->take();
    release();
    return out;
  }

  // Resolves the future with kCancelled if still pending; a request not yet
  // started by its actor is then skipped, a late answer is dropped.
  void cancel() {
    if (state_) state_->cancel();
  }

  // Runs `f(absl::StatusOr<T>)` once, on the thread that completes the
  // future (or now, on this thread, if it is ready). Consumes the future.
  template <typename F>
  void on_ready(F&& f) && {
    if (!state_) {
      std::forward<F>(f)(absl::StatusOr<T>(absl::FailedPreconditionError("invalid future")));
      return;
    }
    auto* s = std::exchange(state_, nullptr);
    s->set_callback(new detail::TypedFutureCallback<T, std::decay_t<F>>(std::forward<F>(f)));
    s->unref();
  }

  // Installs a continuation object (takes ownership). For library code.
  void on_ready_callback(detail::FutureCallback* cb) && {
    auto* s = std::exchange(state_, nullptr);
    s->set_callback(cb);
    s->unref();
  }

  // Chains `f(T)` on success; an error skips `f` and propagates. `f` may return
  // U, absl::StatusOr<U>, absl::Status, void or Future<U>; the result is a
  // Future of the resolved type. Runs where on_ready runs.
  template <typename F>
  auto then(F&& f) && -> Future<detail::resolved_t<std::invoke_result_t<F, T>>> {
    using R = std::invoke_result_t<F, T>;
    using U = detail::resolved_t<R>;
    auto* next = new detail::FutureState<U>();
    next->ref();  // held by the callback
    Future<U> out(next);
    std::move(*this).on_ready([next, fn = std::forward<F>(f)](absl::StatusOr<T> v) mutable {
      if (!v.ok()) {
        next->set(absl::StatusOr<U>(v.status()));
      } else if constexpr (std::is_void_v<R>) {
        fn(std::move(*v));
        next->set(Unit{});
      } else if constexpr (std::is_same_v<R, absl::Status>) {
        absl::Status st = fn(std::move(*v));
        next->set(st.ok() ? absl::StatusOr<U>(Unit{}) : absl::StatusOr<U>(std::move(st)));
      } else if constexpr (detail::IsFuture<R>::value) {
        next->ref();
        fn(std::move(*v)).on_ready([next](absl::StatusOr<U> inner) {
          next->set(std::move(inner));
          next->unref();
        });
      } else {
        next->set(absl::StatusOr<U>(fn(std::move(*v))));
      }
      next->unref();
    });
    return out;
  }

 private:
  void release() {
    if (state_) std::exchange(state_, nullptr)->unref();
  }
  detail::FutureState<T>* state_ = nullptr;
};

// A future that is already resolved.
template <typename T>
Future<std::decay_t<T>> make_ready_future(T&& value) {
  auto* s = new detail::FutureState<std::decay_t<T>>();
  s->set(std::forward<T>(value));
  return Future<std::decay_t<T>>(s);
}
template <typename T>
Future<T> make_failed_future(absl::Status status) {
  auto* s = new detail::FutureState<T>();
  s->set(absl::StatusOr<T>(std::move(status)));
  return Future<T>(s);
}

// Resolves with every value in input order once all succeed, or with the
// first error (the remaining futures are left to finish and are dropped).
template <typename T>
Future<std::vector<T>> when_all(std::vector<Future<T>> futures) {
  auto* out = new detail::FutureState<std::vector<T>>();
  Future<std::vector<T>> result(out);
  if (futures.empty()) {
    out->set(std::vector<T>{});
    return result;
  }
  struct Join {
    detail::Mutex mu;
    std::vector<std::optional<T>> values;
    size_t remaining;
    detail::FutureState<std::vector<T>>* out;
    ~Join() { out->unref(); }
  };
  out->ref();
  auto join = std::make_shared<Join>();
  join->values.resize(futures.size());
  join->remaining = futures.size();
  join->out = out;
  for (size_t i = 0; i < futures.size(); ++i) {
    std::move(futures[i]).on_ready([join, i](absl::StatusOr<T> v) {
      if (!v.ok()) {
        join->out->set(absl::StatusOr<std::vector<T>>(v.status()));
        return;
      }
      std::vector<T> all;
      {
        detail::MutexLock lock(join->mu);
        join->values[i].emplace(std::move(*v));
        if (--join->remaining != 0) return;
        all.reserve(join->values.size());
        for (auto& x : join->values) all.push_back(std::move(*x));
      }
      join->out->set(std::move(all));
    });
  }
  return result;
}

// The first successful value of `when_any` and the index of its future.
template <typename T>
struct WhenAnyResult {
  size_t index;
  T value;
};

// Resolves with the first future to succeed; if all fail, with the last
// error. An empty input resolves with kInvalidArgument.
template <typename T>
Future<WhenAnyResult<T>> when_any(std::vector<Future<T>> futures) {
  auto* out = new detail::FutureState<WhenAnyResult<T>>();
  Future<WhenAnyResult<T>> result(out);
  if (futures.empty()) {
    out->set(absl::InvalidArgumentError("when_any of no futures"));
    return result;
  }
  struct Race {
    std::atomic<size_t> failures{0};
    size_t count;
    detail::FutureState<WhenAnyResult<T>>* out;
    ~Race() { out->unref(); }
  };
  out->ref();
  auto race = std::make_shared<Race>();
  race->count = futures.size();
  race->out = out;
  for (size_t i = 0; i < futures.size(); ++i) {
    std::move(futures[i]).on_ready([race, i](absl::StatusOr<T> v) {
      if (v.ok()) {
        race->out->set(WhenAnyResult<T>{i, std::move(*v)});
      } else if (race->failures.fetch_add(1) + 1 == race->count) {
        race->out->set(absl::StatusOr<WhenAnyResult<T>>(v.status()));
      }
    });
  }
  return result;
}

}  // namespace castmesh
