// ThreadCache<T>: one T per thread for hot-path caches, which the thread may
// still reach after its thread_locals were destroyed (the main thread runs
// the communicator's exit barrier from an atexit handler): get() is then
// nullptr and the caller takes its uncached path.
#pragma once

#include <optional>

namespace castmesh::platform {

template <typename T>
class ThreadCache {
 public:
  // This thread's T, or nullptr once it is destroyed. Any thread.
  static T* get() { return gone_ ? nullptr : &holder_.value; }

 private:
  struct Holder {
    T value;
    ~Holder() { gone_ = true; }
  };
  static inline thread_local bool gone_ = false;
  static inline thread_local Holder holder_;
};

// ThreadLoan<T>: this thread's T lent to one scope at a time, for scratch
// objects that keep their memory between uses (a protobuf message whose
// string fields are reused, a serialization buffer): no allocation per use.
// A nested loan on the same thread, or one after the thread's caches are
// gone, gets a fresh T of its own. The T keeps what the last user left in
// it: the borrower overwrites or clears it.
template <typename T>
class ThreadLoan {
 public:
  ThreadLoan() {
    Slot* slot = ThreadCache<Slot>::get();
    if (slot != nullptr && !slot->lent) {
      slot->lent = true;
      slot_ = slot;
      value_ = &slot->value;
    } else {
      value_ = &own_.emplace();
    }
  }
  ~ThreadLoan() {
    if (slot_ != nullptr) slot_->lent = false;
  }
  ThreadLoan(const ThreadLoan&) = delete;
  ThreadLoan& operator=(const ThreadLoan&) = delete;
  T& operator*() const { return *value_; }
  T* operator->() const { return value_; }

 private:
  struct Slot {
    T value;
    bool lent = false;
  };
  Slot* slot_ = nullptr;
  std::optional<T> own_;
  T* value_ = nullptr;
};

}  // namespace castmesh::platform
