// Internal: shared state between a Future<T> and its promises (OncePort<T>,
// the reply of a request). Thread-safe; any thread may complete, wait or
// attach the single continuation.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <utility>

#include "castmesh/detail/envelope.h"
#include "castmesh/message.h"

namespace castmesh::detail {

class FutureStateBase;

// "reply type mismatch: the handler answers X, the request expects Y".
absl::Status type_mismatch(std::string_view got, std::string_view expected);

// A continuation run once when the state becomes ready. on_future_ready() takes
// ownership of the callback object (it deletes or re-uses itself).
struct FutureCallback {
  virtual ~FutureCallback() = default;
  virtual void on_future_ready(FutureStateBase* state) = 0;
};

class FutureStateBase : public ReplySink, public MessageMemory {
 public:
  FutureStateBase() = default;
  FutureStateBase(const FutureStateBase&) = delete;
  FutureStateBase& operator=(const FutureStateBase&) = delete;

  void ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void unref() {
    // A reference is only ever added by a holder of one (ref, add_promise),
    // so a holder that sees the count at 1 holds the last one and nobody can
    // add another: it skips the atomic decrement (the answer's unref on the
    // ask/reply path). The acquire load pairs with the other holders'
    // releasing decrements.
    if (refs_.load(std::memory_order_acquire) == 1 || refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      delete this;
    }
  }

  void add_promise() override {
    promises_.fetch_add(1, std::memory_order_relaxed);
    ref();
  }
  void drop_promise() override;
  // A state nobody else sees yet: counts one promise (and its reference)
  // with plain stores instead of two atomic increments, for
  // ReplyRef::adopt on the request path. Only before the state is shared.
  FutureStateBase* with_first_promise() {
    promises_.store(1, std::memory_order_relaxed);
    refs_.store(refs_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return this;
  }
  bool cancelled() const override { return cancelled_.load(std::memory_order_acquire); }
  PortAddress port_address() override;

  // The first caller wins the right to set the value, then calls publish().
  bool try_claim() { return !claimed_.exchange(true, std::memory_order_acq_rel); }
  bool is_ready() const { return ready_.load(std::memory_order_acquire) != 0; }
  // Marks ready, wakes blocked waiters and runs the continuation.
  void publish();
  // Blocks until ready or the deadline; true when ready. Called by the one
  // consumer (a Future).
  bool wait(absl::Time deadline);
  // Installs the continuation (takes ownership); runs it now if ready.
  void set_callback(FutureCallback* cb);
  // Resolves with kCancelled if still pending.
  void cancel();
  // Sets an error if the state is still unclaimed.
  virtual void fail(absl::Status status) = 0;

 protected:
  virtual ~FutureStateBase() = default;

 private:
  std::atomic<int32_t> refs_{1};
  std::atomic<int32_t> promises_{0};
  std::atomic<bool> claimed_{false};
  std::atomic<bool> cancelled_{false};
  std::atomic<uint32_t> ready_{0};
  std::atomic<uint32_t> waiters_{0};
  std::atomic<uintptr_t> callback_{0};  // 0 none, 1 ran/ready, else FutureCallback*
  std::atomic<bool> registered_{false};
  std::atomic<uint64_t> port_id_{0};
};

template <typename T>
class FutureState final : public FutureStateBase {
 public:
  uint32_t value_type() const override { return type_id<T>(); }
  void complete_value(uint32_t type, void* value) override {
    if (type != type_id<T>()) {
      set(absl::StatusOr<T>(type_mismatch(type_name_of(type), type_name<T>())));
      return;
    }
    // GCC 12 at -O3 speculatively devirtualises ReplyRef::complete_value into
    // this function for a reply of another (smaller) type, e.g. the Unit
    // answer of a void handler reaching FutureState<int64_t>, and then warns
    // that this move reads past that object, although the type check above
    // makes the path unreachable (a bogus -Warray-bounds, GCC meta-bug
    // PR 56456). Silenced for this statement only, so -Werror Release builds
    // of user code do not fail.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#endif
    set(absl::StatusOr<T>(std::move(*static_cast<T*>(value))));
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  }
  void complete_error(absl::Status status) override { set(absl::StatusOr<T>(std::move(status))); }
  void fail(absl::Status status) override { complete_error(std::move(status)); }

  // Sets the result if nobody did; returns false if it was already set.
  bool set(absl::StatusOr<T> v) {
    if (!try_claim()) return false;
    value_.emplace(std::move(v));
    publish();
    return true;
  }
  // Moves the result out; valid once is_ready().
  absl::StatusOr<T> take() {
    if (!value_) return absl::FailedPreconditionError("future value already retrieved");
    absl::StatusOr<T> out = std::move(*value_);
    value_.reset();
    return out;
  }

 private:
  std::optional<absl::StatusOr<T>> value_;
};

template <typename T, typename F>
struct TypedFutureCallback final : FutureCallback {
  explicit TypedFutureCallback(F f) : fn(std::move(f)) {}
  void on_future_ready(FutureStateBase* s) override {
    fn(static_cast<FutureState<T>*>(s)->take());
    delete this;
  }
  F fn;
};

}  // namespace castmesh::detail
