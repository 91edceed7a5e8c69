#include "core/link/receiver.h"

#include <atomic>
#include <string>

#include "core/log/log.h"

namespace castmesh::link {
namespace {

// What deliveries meet when no matching layer registered: they are dropped, loudly.
class NoReceiver final : public Receiver {
 public:
  void on_compact(const Envelope&, const char*, size_t) override { complain(); }
  void on_frame(const std::weak_ptr<proc::ProcHost>&, const ProcId&, std::string_view, const char*, size_t,
                wire::Payload) override {
    complain();
  }
  void abort_collective(std::string_view, int, uint64_t, const absl::Status&) override { complain(); }
  void on_peer_lost(const ProcId&, const absl::Status&) override {}

 private:
  static void complain() { CASTMESH_LOG_ERROR("castmesh-link: a message arrived but no receiver is registered"); }
};

NoReceiver g_none;
std::atomic<Receiver*> g_receiver{&g_none};

}  // namespace

void set_receiver(Receiver* receiver) { g_receiver.store(receiver, std::memory_order_release); }

Receiver& receiver() { return *g_receiver.load(std::memory_order_acquire); }

}  // namespace castmesh::link
