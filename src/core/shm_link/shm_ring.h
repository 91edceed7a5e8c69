// ShmRing: a single-producer single-consumer ring of records in a POSIX
// shared-memory segment, with a doorbell word the consumer sleeps on, so two
// processes of one host exchange small messages with no system call on the
// fast path (a few cache-line transfers each way).
//
// One segment carries one direction: the producer process creates it (a
// random, unguessable name, mode 0600), tells the consumer the name over an
// authenticated channel, and the consumer opens it, checks its header and
// maps it; either side unlinks the name as soon as both have it mapped, so
// no segment outlives the two processes in /dev/shm.
//
// Records are [u32 size][u32 kind][u32 meta_size][u32 0] meta body, each
// 16-byte aligned and contiguous (a record that would cross the end of the
// ring is preceded by a skip record filling the rest). head and tail are
// byte counts that only grow; each sits on its own cache line.
//
// Doorbell: the consumer that is about to sleep sets `sleeping` and
// re-checks the ring; a producer that published a record rings the doorbell
// (a futex wake, no PRIVATE flag: the word is shared between processes) only
// when `sleeping` is set and no thread of the consumer is polling. Threads
// of the consumer that spin on the ring count themselves in `pollers`.
// A consumer thread that waits for a message itself (rather than leaving the
// ring to the sleeping thread) arms the ring's second word, the waiter bell,
// and sleeps on the waiter bells of all its rings at once
// (detail::futex_wait_any): a producer wakes it directly, one wake-up.
//
// Thread-safety: one producer thread and one consumer thread at a time
// (callers serialise each side); the doorbell calls are safe from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace castmesh::shm_link {

// Record kinds 1..kMaxKind belong to the user of the ring; 0 is the skip.
inline constexpr uint32_t kMaxKind = 255;

class ShmRing {
 public:
  // Bytes of a record's fixed part.
  static constexpr size_t kRecordHeaderBytes = 16;

  // A new segment with room for `capacity` bytes of records (a power of
  // two, 4 KiB to 256 MiB), named "/cm-<96 random bits>". The name stays
  // until unlink() (or this object's end, for the creator).
  static absl::StatusOr<std::unique_ptr<ShmRing>> Create(size_t capacity);
  // Maps the segment `name` made by Create in another process, after
  // checking its size, magic, version and capacity: a malformed or foreign
  // segment is kInvalidArgument naming what is wrong; a missing one
  // kNotFound.
  static absl::StatusOr<std::unique_ptr<ShmRing>> Open(const std::string& name);
  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  // The segment's name (what the consumer passes to Open).
  const std::string& name() const { return name_; }
  // Removes the name from the system (idempotent; the mappings stay).
  void unlink();
  size_t capacity() const { return capacity_; }
  // The largest meta + body a record may carry: a record takes at most half
  // the ring, so it always fits once the consumer has caught up, wherever
  // the ring's end falls.
  size_t max_payload() const { return capacity_ / 2 - kRecordHeaderBytes; }

  // Producer: appends one record of `kind` (1..kMaxKind) carrying `meta`
  // then `body`, and rings the doorbell if the consumer sleeps. False when
  // the ring has no room for it now (nothing written). The record must fit
  // max_payload().
  bool try_write(uint32_t kind, std::string_view meta, std::string_view body);

  // A record as the consumer sees it: views into the ring, valid until pop().
  struct Record {
    uint32_t kind = 0;
    std::string_view meta;
    std::string_view body;
  };
  // Consumer: the oldest unread record, or nullopt when the ring is empty;
  // kDataLoss when the producer wrote something malformed (the ring is
  // then unusable).
  absl::StatusOr<std::optional<Record>> peek();
  // Consumer: frees the record peek() returned.
  void pop();
  // Whether a record is waiting (any thread; a hint unless the caller is the consumer).
  bool readable() const;

  // Consumer's sleeping thread: sleeps until a producer rings, `deadline`,
  // or a record is already waiting. Spurious returns are possible.
  void sleep_until_rung(absl::Time deadline);
  // Wakes the consumer's sleeping thread (any thread of either process).
  void ring();
  // A consumer thread starts / stops spinning on the ring: producers need
  // not ring while one spins. After stop_polling() the caller must look at
  // the ring once more before sleeping elsewhere (a record published while
  // it spun may not have rung).
  void start_polling();
  void stop_polling();
  // Whether a consumer thread spins on the ring now (a hint).
  bool polled() const;
  // The consumer's sleeping thread, sleeping on several rings' doorbells at
  // once (detail::futex_wait_any): arm_sleeper() announces it (producers ring
  // from now on) and returns the doorbell's value to sleep on; the caller
  // must then look at readable() before sleeping, and call disarm_sleeper()
  // once awake. The same contract as sleep_until_rung, split in two. A
  // thread may also sleep on doorbell() unannounced (without arm_sleeper,
  // while another consumer thread polls the ring): producers then do not
  // ring for it, and only an explicit ring() or its deadline wakes it.
  uint32_t arm_sleeper();
  void disarm_sleeper();
  std::atomic<uint32_t>* doorbell();

  // A consumer thread about to sleep on waiter_bell() (with
  // detail::futex_wait_any, usually with other rings' bells): arm() counts it
  // as a sleeper, so every later try_write wakes it, and returns the bell's
  // value to sleep on; after arm() the caller must look at the ring
  // (readable()) before sleeping. disarm() once awake. Any consumer thread.
  uint32_t arm_waiter();
  void disarm_waiter();
  std::atomic<uint32_t>* waiter_bell();

 private:
  struct Layout;
  ShmRing(std::string name, void* base, size_t mapped, size_t capacity, bool creator);

  std::string name_;
  void* base_ = nullptr;
  size_t mapped_ = 0;
  Layout* layout_ = nullptr;
  char* data_ = nullptr;
  size_t capacity_ = 0;
  bool unlinked_ = false;
  bool creator_ = false;
  // The consumer's peeked record's length in the ring (skip included).
  uint64_t peeked_bytes_ = 0;
  // Producer: the consumer's head as last read (it only grows).
  uint64_t cached_head_ = 0;
};

}  // namespace castmesh::shm_link
