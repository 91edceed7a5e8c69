// ThreadCache<T>: one T per thread for hot-path caches, which the thread may
// still reach after its thread_locals were destroyed (the main thread runs
// the communicator's exit barrier from an atexit handler): get() is then
// nullptr and the caller takes its uncached path.
#pragma once

namespace castmesh::collectives {

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

}  // namespace castmesh::collectives
