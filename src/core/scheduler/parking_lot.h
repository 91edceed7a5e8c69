// The portable stand-in for the Linux futex (see futex.h): threads block on
// the address of a 32-bit atomic word in a fixed table of buckets, each a
// mutex and a FIFO list of the threads parked on addresses that hash to it;
// every parked thread has its own condition variable, so a wake reaches only
// threads parked on that address. The word is compared under the bucket's
// mutex and a waker takes the same mutex after changing the word, so a wake
// that follows a store is never lost. No polling: a parked thread sleeps
// until woken or its deadline. Any thread.
#pragma once

#include <absl/time/time.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace castmesh::detail {

// Sleeps while *word == expected, until woken or `deadline`. Returns false
// when the deadline passed; true when woken or *word != expected.
bool parking_lot_wait(std::atomic<uint32_t>* word, uint32_t expected, absl::Time deadline);
// Wakes up to `count` threads parked on `word`, oldest first; returns how
// many. `word` is only hashed, never read: it may already be freed.
int parking_lot_wake(const void* word, int count);
// How many threads are parked on `word` now (tests).
size_t parking_lot_parked(const void* word);

}  // namespace castmesh::detail
