// castmesh._castmesh.Channel, open_channel and port_send: the C++ half of
// castmesh.Channel / Port. A port is a small actor in the receiving process
// whose handler queues the pickled message; recv() is a CallFuture of the
// next one.
#include <pybind11/pybind11.h>

#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "bindings.h"
#include "call_slot.h"
#include "castmesh/actor.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/runtime.h"
#include "py_call.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;
namespace {

// The messages of one Python channel (castmesh.Channel), in arrival order,
// and the receives waiting for them: the i-th recv() gets the i-th message.
class PortQueue {
 public:
  // Any thread (the port actor's handler).
  void push(std::string payload) {
    std::shared_ptr<CallFuture> waiter;
    {
      detail::MutexLock lock(mu_);
      if (waiters_.empty()) {
        items_.push_back(std::move(payload));
        return;
      }
      waiter = std::move(waiters_.front());
      waiters_.pop_front();
    }
    waiter->complete(std::move(payload));
  }

  // The next message, now or once it arrives (Python's PortReceiver.recv).
  std::shared_ptr<CallFuture> recv() {
    auto slot = std::make_shared<CallFuture>();
    std::string payload;
    {
      detail::MutexLock lock(mu_);
      if (items_.empty()) {
        waiters_.push_back(slot);
        return slot;
      }
      payload = std::move(items_.front());
      items_.pop_front();
    }
    slot->complete(std::move(payload));
    return slot;
  }

 private:
  detail::Mutex mu_;
  std::deque<std::string> items_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<CallFuture>> waiters_ ABSL_GUARDED_BY(mu_);
};

// The receiving end of a channel: an actor in the process that opened it,
// whose address is what a castmesh.Port pickles to. Its one handler queues
// the pickled message; it never touches Python.
class PyPortActor : public Actor {
 public:
  explicit PyPortActor(std::shared_ptr<PortQueue> queue) : queue_(std::move(queue)) {}
  void deliver(const PyCall& message) { queue_->push(message.payload); }
  using Handlers = castmesh::Handlers<&PyPortActor::deliver>;

 private:
  std::shared_ptr<PortQueue> queue_;
};

// A channel opened in this process (castmesh.Channel.open): its port
// actor's address and its queue. Closing stops the actor.
struct PyChannel {
  ActorRef<PyPortActor> port;
  std::shared_ptr<PortQueue> queue;

  std::string address() const { return port.address().to_string(); }
  void close() const {
    py::gil_scoped_release release;
    port.stop();
  }
};

PyChannel open_channel() {
  Runtime& runtime = current_runtime();
  auto queue = std::make_shared<PortQueue>();
  SpawnOptions options;
  options.name = "castmesh.port";
  absl::StatusOr<ActorRef<PyPortActor>> ref = absl::UnknownError("not spawned");
  {
    py::gil_scoped_release release;
    ref = runtime.spawn_with<PyPortActor>(std::move(options), queue);
  }
  return PyChannel{value_or_throw(std::move(ref), ErrorDomain::kProc), std::move(queue)};
}

// Sends one pickled message to the port at `address`, from any process with
// a runtime. Fire and forget: a port whose receiver is gone drops it.
void port_send(const std::string& address, std::string payload) {
  Address parsed = value_or_throw(Address::parse(address), ErrorDomain::kValue);
  py::gil_scoped_release release;
  ActorRef<PyPortActor>::from_address(std::move(parsed)).tell(PyCall{"port", std::move(payload), true});
}

}  // namespace

void bind_channels(py::module_& module) {
  py::class_<PyChannel>(module, "Channel", "A channel opened here: its port actor and message queue.")
      .def_property_readonly("address", &PyChannel::address, "Where senders send (the port actor's address).")
      .def("recv", [](const PyChannel& c) { return c.queue->recv(); }, "A CallFuture of the next message.")
      .def("close", &PyChannel::close, "Stops the port actor; later messages are dropped.");
  module.def("open_channel", &open_channel, "Opens a channel in this process (castmesh.Channel.open).");
  module.def("port_send", &port_send, py::arg("address"), py::arg("payload"),
             "Sends pickled bytes to the port at `address` (fire and forget).");
}

}  // namespace castmesh::python
