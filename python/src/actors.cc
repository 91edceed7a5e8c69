// Python actors on the C++ core.
//
// Every Python actor is hosted by a PyActorHost: a C++ actor on a dedicated
// thread (its handlers take the GIL and run Python code, which may block).
// Its one message, PyCall, carries an endpoint name and the pickled
// arguments; its answer is the pickled outcome (a value or the remote
// exception's type, message and traceback), built by castmesh._host. The
// controller spawns hosts on worker procs through the ProcMesh (registered
// actor "castmesh.PyActorHost", constructor argument: the pickled actor
// class and its arguments) and talks to them through ActorRefs, so every
// Python message travels over castmesh's transport like any C++ message.
//
// Python sees (module castmesh._castmesh, private; the public API is the
// castmesh package): Runtime, ProcMesh, ActorRef, CallFuture, run_worker,
// spawn_local.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "bindings.h"
#include "castmesh/actor.h"
#include "castmesh/actor_mesh.h"
#include "castmesh/message.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/runtime.h"
#include "castmesh/shape.h"
#include "castmesh/value_mesh.h"
#include "core/platform/process.h"
#include "core/proc/proc_host.h"
#include "core/wire/handshake.h"
#include "py_reducers.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;

// One call of a Python endpoint: its name and pickle.dumps((args, kwargs)).
// `oneway`: sent by broadcast (tell), nobody reads the reply, so the host
// logs an exception instead.
struct PyCall {
  std::string endpoint;
  std::string payload;
  bool oneway = false;
};

namespace {

// Wire form of PyCall: 4-byte little-endian endpoint length, a flags byte
// (bit 0: oneway), endpoint, payload.
absl::Status encode_py_call(const PyCall& call, std::string* out) {
  const auto n = static_cast<uint32_t>(call.endpoint.size());
  out->clear();
  out->reserve(5 + call.endpoint.size() + call.payload.size());
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out->push_back(call.oneway ? 1 : 0);
  out->append(call.endpoint);
  out->append(call.payload);
  return absl::OkStatus();
}

absl::Status decode_py_call(std::string_view bytes, PyCall* call) {
  if (bytes.size() < 5) return absl::InvalidArgumentError("PyCall: truncated header");
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (bytes.size() - 5 < n) return absl::InvalidArgumentError("PyCall: endpoint name longer than the message");
  call->oneway = (bytes[4] & 1) != 0;
  call->endpoint.assign(bytes.substr(5, n));
  call->payload.assign(bytes.substr(5 + n));
  return absl::OkStatus();
}

}  // namespace

CASTMESH_REGISTER_MESSAGE(PyCall, "castmesh.python.PyCall", encode_py_call, decode_py_call);

// The C++ actor hosting one Python actor (see the file comment). Runs on its
// own thread; takes the GIL for on_start, each call and on_stop.
class PyActorHost : public Actor {
 public:
  explicit PyActorHost(std::string spec) : spec_(std::move(spec)) {}
  ~PyActorHost() override { release_host(); }

  void on_start() override {
    if (!python_usable()) return;
    py::gil_scoped_acquire gil;
    try {
      py::object host_class = py::module_::import("castmesh._host").attr("ActorHost");
      host_ = host_class(py::bytes(spec_), address().to_string(), address().index);
    } catch (py::error_already_set& error) {
      // castmesh._host reports constructor errors as the host's failure
      // (below); this is a broken installation (module missing).
      fail(absl::InternalError(std::string("cannot create the Python actor host: ") + error.what()));
    }
    spec_.clear();
    fail_if_python_failed();
  }

  void on_stop() override { release_host(); }

  std::string call(const PyCall& call) {
    if (!python_usable()) return {};
    py::gil_scoped_acquire gil;
    if (!host_) return {};
    py::object reply = host_.attr("handle")(
        call.endpoint, py::memoryview::from_memory(call.payload.data(), call.payload.size()), call.oneway);
    char* data = nullptr;
    Py_ssize_t size = 0;
    if (PyBytes_AsStringAndSize(reply.ptr(), &data, &size) != 0) throw py::error_already_set();
    std::string out(data, static_cast<size_t>(size));
    fail_if_python_failed();
    return out;
  }

  using Handlers = castmesh::Handlers<&PyActorHost::call>;

 private:
  // The Python actor failed (its constructor raised, an endpoint raised a
  // BaseException that is not an Exception, or it left a failure of a mesh
  // it owns unhandled): this actor fails with that reason, so its mesh and
  // monitors see a failed member. Called with the GIL held.
  void fail_if_python_failed() {
    if (!host_) return;
    py::object failure = host_.attr("failure");
    if (!failure.is_none()) fail(absl::AbortedError(py::str(failure).cast<std::string>()));
  }

  void release_host() {
    if (!host_ || !python_usable()) {
      // Interpreter gone: leak the reference rather than touch Python.
      if (host_) host_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    try {
      host_.attr("close")();
    } catch (py::error_already_set&) {
    }
    host_ = py::object();
  }

  std::string spec_;
  py::object host_;
};

namespace {

constexpr char kHostActorName[] = "castmesh.PyActorHost";

// Registered by hand (not CASTMESH_REGISTER_ACTOR) so that hosts spawned by
// other procs get a dedicated thread.
const bool g_host_registered [[maybe_unused]] = [] {
  detail::ActorFactory factory;
  factory.name = kHostActorName;
  factory.arg_types = {std::string(type_name<std::string>())};
  factory.spawn = [](Runtime& runtime, SpawnOptions options,
                     const std::vector<std::string>& args) -> absl::StatusOr<Address> {
    if (args.size() != 1) return absl::InvalidArgumentError("castmesh.PyActorHost takes one argument (the spec)");
    std::string spec;
    if (absl::Status st = detail::decode_value(args[0], &spec); !st.ok()) return st;
    options.dedicated_thread = true;
    auto ref = runtime.spawn_with<PyActorHost>(std::move(options), std::move(spec));
    if (!ref.ok()) return ref.status();
    return ref->address();
  };
  detail::register_actor_factory(type_id<PyActorHost>(), std::move(factory));
  return true;
}();

py::object to_python(const std::string& value) { return py::bytes(value); }
py::object to_python(const ValueMesh<std::string>& mesh) {
  py::list out;
  for (const std::string& v : mesh.values()) out.append(py::bytes(v));
  return out;
}

// The result of one call (T = std::string) or of a mesh call (T =
// ValueMesh<std::string>), shared by the C++ completion callback and Python.
// Python waits on it (GIL released) or registers callbacks, which run on the
// completing thread with the GIL taken.
template <typename T>
class CallSlot {
 public:
  ~CallSlot() {
    if (!callbacks_.empty()) {
      if (python_usable()) {
        py::gil_scoped_acquire gil;
        callbacks_.clear();
      } else {
        for (auto& cb : callbacks_) cb.release();
      }
    }
  }

  void complete(absl::StatusOr<T> result) {
    std::vector<py::object> callbacks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      result_ = std::move(result);
      done_ = true;
      callbacks.swap(callbacks_);
    }
    cv_.notify_all();
    if (callbacks.empty()) return;
    if (!python_usable()) {
      for (auto& cb : callbacks) cb.release();
      return;
    }
    py::gil_scoped_acquire gil;
    for (auto& cb : callbacks) {
      try {
        cb();
      } catch (py::error_already_set& error) {
        error.discard_as_unraisable("castmesh future callback");
      }
    }
    callbacks.clear();
  }

  // The result (bytes, or a list of bytes for a mesh call), None when not
  // done within `timeout` seconds (negative: no limit); a failed call
  // raises ProcError with its status code. Waits with the GIL released;
  // without a limit it wakes every 100 ms to run Python's signal handlers,
  // so Ctrl-C interrupts a wait (KeyboardInterrupt).
  py::object wait(double timeout) {
    bool done = false;
    for (;;) {
      const bool bounded = timeout >= 0;
      const double chunk = bounded ? timeout : 0.1;
      {
        py::gil_scoped_release release;
        std::unique_lock<std::mutex> lock(mu_);
        if (chunk > 0) cv_.wait_for(lock, std::chrono::duration<double>(chunk), [this] { return done_; });
        done = done_;
      }
      if (done || bounded) break;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    if (!done) return py::none();
    if (!result_.ok()) throw_status(result_.status(), ErrorDomain::kProc);
    return to_python(*result_);
  }

  // Runs `callback()` once the call completes (now if it has).
  void add_callback(py::object callback) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!done_) {
        callbacks_.push_back(std::move(callback));
        return;
      }
    }
    callback();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::StatusOr<T> result_;
  std::vector<py::object> callbacks_;
};
using CallFuture = CallSlot<std::string>;
using MeshCallFuture = CallSlot<ValueMesh<std::string>>;

template <typename T>
std::shared_ptr<CallSlot<T>> track(Future<T> future) {
  auto slot = std::make_shared<CallSlot<T>>();
  std::move(future).on_ready([slot](absl::StatusOr<T> result) { slot->complete(std::move(result)); });
  return slot;
}

[[noreturn]] void raise_status(const absl::Status& status) { throw_status(status, ErrorDomain::kProc); }

// A ref to one PyActorHost, wherever it lives.
struct PyActorRef {
  ActorRef<PyActorHost> ref;

  std::shared_ptr<CallFuture> ask(const std::string& endpoint, std::string payload) const {
    py::gil_scoped_release release;
    return track(ref.ask(PyCall{endpoint, std::move(payload)}));
  }
  void tell(const std::string& endpoint, std::string payload) const {
    py::gil_scoped_release release;
    ref.tell(PyCall{endpoint, std::move(payload), /*oneway=*/true});
  }
};

PyActorRef ref_from_address(const std::string& text) {
  return PyActorRef{ActorRef<PyActorHost>::from_address(value_or_throw(Address::parse(text), ErrorDomain::kValue))};
}

// Named sizes of a mesh, outermost first, as Python passes them.
using Dims = std::vector<std::pair<std::string, size_t>>;

// The runtime of a Python controller process (one per process, made by the
// castmesh package on first use).
class PyRuntime {
 public:
  // The runtime becomes a proc (transport endpoint, fresh mesh secret) at
  // once and stays one for the life of the process: every proc mesh it
  // allocates reuses that identity, and actors spawned here before or
  // between allocations (this_proc().spawn, the C++ ActorMesh's forwarders)
  // keep their addresses.
  //
  // With `listen` (a rendezvous controller, castmesh.Rendezvous) it listens
  // there with `secret` (empty: CASTMESH_SECRET) so that procs started by a
  // launcher can join; otherwise on a fresh abstract Unix address with a
  // fresh secret.
  explicit PyRuntime(int workers, const std::string& listen, const std::string& secret,
                     const std::string& advertise_host) {
    RuntimeOptions options;
    options.workers = workers;
    runtime_ = std::make_unique<Runtime>(std::move(options));
    if (!listen.empty()) {
      RendezvousAllocatorOptions rendezvous;
      rendezvous.listen = listen;
      rendezvous.secret = secret;
      rendezvous.advertise_host = advertise_host;
      RendezvousAllocator allocator(std::move(rendezvous));
      absl::StatusOr<std::string> address = allocator.listen(*runtime_);
      if (!address.ok()) raise_status(address.status());
      host_ = proc::ProcHost::of(*runtime_);  // taken before the allocator lets go of it
      return;
    }
    proc::ProcHostOptions host_options;
    host_options.secret = wire::make_secret();
    auto host = proc::ProcHost::attach(*runtime_, std::move(host_options));
    if (!host.ok()) raise_status(host.status());
    host_ = *std::move(host);
  }
  // The runtime is shut down but deliberately never destroyed: proc meshes
  // and refs held by Python objects (freed in any order while the
  // interpreter exits) still point into it. One per process, so the leak is
  // bounded.
  ~PyRuntime() {
    shutdown();
    (void)runtime_.release();
  }

  // Starts worker procs shaped `dims` (the C++ ProcMesh has the Python
  // mesh's shape, so Python slices of it are C++ slices of the same view).
  ProcMesh allocate(const Dims& dims, std::vector<std::string> argv,
                    std::vector<std::pair<std::string, std::string>> env, double join_timeout_s) {
    LocalAllocatorOptions options;
    options.worker_argv = std::move(argv);
    options.worker_env = std::move(env);
    options.join_timeout = absl::Seconds(join_timeout_s);
    return allocate_with(LocalAllocator(std::move(options)), dims);
  }

  // Waits for the procs of `dims`, started by a launcher, to join this
  // runtime's address (RendezvousAllocator; rank r at row-major position r).
  ProcMesh allocate_rendezvous(const Dims& dims, double join_timeout_s) {
    RendezvousAllocatorOptions options;
    options.secret = host_->secret();
    options.join_timeout = absl::Seconds(join_timeout_s);
    return allocate_with(RendezvousAllocator(std::move(options)), dims);
  }

  // This controller's proc id: its address.
  std::string address() const { return host_ ? host_->id() : std::string(); }
  // Whether the procs of this controller prove `secret` (a later Rendezvous
  // that names another secret cannot reuse this address).
  bool has_secret(const std::string& secret) const { return host_ && host_->secret() == secret; }

  void shutdown() {
    if (!runtime_) return;
    host_.reset();
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      runtime_->shutdown();
    } else {
      runtime_->shutdown();
    }
  }

  Runtime& runtime() { return *runtime_; }

 private:
  // Runs the allocation (which waits for procs to join) without the GIL;
  // a failure becomes the Python exception of its status.
  template <typename Allocator>
  ProcMesh allocate_with(Allocator allocator, const Dims& dims) {
    absl::StatusOr<ProcMesh> mesh;
    {
      py::gil_scoped_release release;
      absl::StatusOr<Shape> shape = Shape::Create(dims);
      mesh = shape.ok() ? allocator.allocate(*runtime_, *shape) : absl::StatusOr<ProcMesh>(shape.status());
    }
    if (!mesh.ok()) raise_status(mesh.status());
    return std::move(*mesh);
  }

  std::unique_ptr<Runtime> runtime_;
  std::shared_ptr<proc::ProcHost> host_;
};

// A castmesh::ActorMesh over the Python actor hosts of a ProcMesh: cast and
// call travel along the mesh's cast tree, and a member whose proc dies fails
// pending and later calls naming its point.
struct PyActorMesh {
  ActorMesh<PyActorHost> mesh;

  std::vector<PyActorRef> refs() const {
    std::vector<PyActorRef> out;
    for (auto& r : mesh.refs()) out.push_back(PyActorRef{r});
    return out;
  }
  PyActorMesh select_index(const std::string& name, int64_t index) const {
    return PyActorMesh{value_or_throw(mesh.slice(name, Selector(index)), ErrorDomain::kValue)};
  }
  PyActorMesh select_range(const std::string& name, int64_t start, int64_t stop, int64_t step) const {
    // Python normalises its slices first (castmesh.shape.normalize_selector):
    // a negative value here is refused by the C++ Shape, never read as "to the end".
    return PyActorMesh{value_or_throw(mesh.slice(name, Selector(Range(start, stop, step))), ErrorDomain::kValue)};
  }
  void cast(const std::string& endpoint, std::string payload) const {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = mesh.cast(PyCall{endpoint, std::move(payload), /*oneway=*/true});
    }
    if (!status.ok()) raise_status(status);
  }
  std::shared_ptr<MeshCallFuture> call(const std::string& endpoint, std::string payload) const {
    py::gil_scoped_release release;
    return track(mesh.call(PyCall{endpoint, std::move(payload)}));
  }
  // A call whose replies are pieces (py_reducers.h) folded with the reducer
  // `op` on the way up the cast tree: one piece for the whole mesh.
  std::shared_ptr<CallFuture> call_reduce(const std::string& endpoint, std::string payload,
                                          const std::string& op) const {
    Reducer<std::string> reducer = value_or_throw(piece_reducer(op), ErrorDomain::kValue);
    py::gil_scoped_release release;
    return track(mesh.call(PyCall{endpoint, std::move(payload)}, std::move(reducer)));
  }
  // Through the cast tree like call(), so it stays ordered after casts.
  std::shared_ptr<CallFuture> call_one(const std::string& endpoint, std::string payload) const {
    py::gil_scoped_release release;
    return track(mesh.call_one(PyCall{endpoint, std::move(payload)}));
  }
};

// The replies of a mesh stream, in arrival order.
struct PyReplyStream {
  std::shared_ptr<ReplyStream<std::string>> stream;

  // ("ok", position, bytes) | ("timeout", -1, None) | ("end", -1, None); a
  // failed reply or stream raises ProcError with its status code. Waits up
  // to `timeout` s (< 0: no limit).
  py::tuple next(double timeout) {
    absl::StatusOr<std::pair<Point, absl::StatusOr<std::string>>> item = absl::UnknownError("");
    {
      py::gil_scoped_release release;
      item = stream->next(timeout < 0 ? absl::InfiniteDuration() : absl::Seconds(timeout));
    }
    if (!item.ok()) {
      if (item.status().code() == absl::StatusCode::kOutOfRange) return py::make_tuple("end", -1, py::none());
      if (item.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return py::make_tuple("timeout", -1, py::none());
      }
      throw_status(item.status(), ErrorDomain::kProc);
    }
    const auto position = static_cast<int64_t>(item->first.position());
    if (!item->second.ok()) throw_status(item->second.status(), ErrorDomain::kProc);
    return py::make_tuple("ok", position, py::bytes(*item->second));
  }
};

PyActorMesh spawn_actor_mesh(const ProcMesh& procs, const std::string& name, std::string spec,
                             const std::vector<std::pair<std::string, size_t>>& dims) {
  absl::StatusOr<ActorMesh<PyActorHost>> mesh = absl::UnknownError("not spawned");
  {
    py::gil_scoped_release release;
    absl::StatusOr<Shape> shape = Shape::Create(dims);
    if (!shape.ok()) {
      mesh = shape.status();
    } else {
      MeshOptions options;
      options.name = name;
      // A dead proc fails the calls that include it (ProcError in Python);
      // the actors on the other procs keep running.
      options.on_failure = [](const MeshEvent&) { return MeshFailureAction::kContinue; };
      mesh = ActorMesh<PyActorHost>::Spawn(procs, *shape, std::move(options), spec);
    }
  }
  if (!mesh.ok()) raise_status(mesh.status());
  return PyActorMesh{*std::move(mesh)};
}

std::vector<PyActorRef> spawn_on_mesh(const ProcMesh& mesh, const std::string& name, std::string spec) {
  absl::StatusOr<std::vector<ActorRef<PyActorHost>>> refs;
  {
    py::gil_scoped_release release;
    refs = mesh.spawn<PyActorHost>(name, spec);
  }
  if (!refs.ok()) raise_status(refs.status());
  std::vector<PyActorRef> out;
  out.reserve(refs->size());
  for (auto& r : *refs) out.push_back(PyActorRef{std::move(r)});
  return out;
}

// The runtime of the calling process (the controller's or the worker's);
// a Python RuntimeError where there is none.
Runtime& current_runtime() {
  Runtime* runtime = Runtime::current();
  if (runtime == nullptr) throw std::runtime_error("no castmesh runtime in this process");
  return *runtime;
}

// The messages of one Python channel (castmesh.Channel), in arrival order,
// and the receives waiting for them: the i-th recv() gets the i-th message.
class PortQueue {
 public:
  // Any thread (the port actor's handler).
  void push(std::string payload) {
    std::shared_ptr<CallFuture> waiter;
    {
      std::lock_guard<std::mutex> lock(mu_);
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
      std::lock_guard<std::mutex> lock(mu_);
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
  std::mutex mu_;
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
  if (!ref.ok()) raise_status(ref.status());
  return PyChannel{*std::move(ref), std::move(queue)};
}

// Sends one pickled message to the port at `address`, from any process with
// a runtime. Fire and forget: a port whose receiver is gone drops it.
void port_send(const std::string& address, std::string payload) {
  Address parsed = value_or_throw(Address::parse(address), ErrorDomain::kValue);
  py::gil_scoped_release release;
  ActorRef<PyPortActor>::from_address(std::move(parsed)).tell(PyCall{"port", std::move(payload), true});
}

// One watched actor stopped with an error (see watch_failures).
struct FailureReport {
  int64_t token = 0;     // the watch's token (castmesh.supervision's mesh record)
  int64_t position = 0;  // the member's position in the list that was watched
  std::string actor;     // its address
  std::string reason;    // the status, "ABORTED: ..."
};

// Failures of watched actors, from the runtime threads that report them to
// the one Python thread that handles them (castmesh.supervision). Never
// destroyed: runtime threads may push while the interpreter exits.
class FailureQueue {
 public:
  // Any thread; never blocks on Python. Dropped once the queue is closed.
  void push(FailureReport report) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      reports_.push_back(std::move(report));
    }
    cv_.notify_one();
  }

  // The next report as (token, position, actor, reason), or None after
  // `timeout` seconds or at once when the queue is closed. Waits with the
  // GIL released.
  py::object next(double timeout) {
    std::optional<FailureReport> report;
    {
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::duration<double>(timeout),
                   [this] { return closed_ || !reports_.empty(); });
      if (!closed_ && !reports_.empty()) {
        report = std::move(reports_.front());
        reports_.pop_front();
      }
    }
    if (!report) return py::none();
    return py::make_tuple(report->token, report->position, report->actor, report->reason);
  }

  // The process is exiting: wakes the waiting thread so that it can be
  // joined while Python still runs threads (a thread that takes the GIL back
  // after finalization has begun is ended by pthread_exit, whose unwinding
  // through pybind11's noexcept gil_scoped_release ends in std::terminate).
  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      reports_.clear();
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<FailureReport> reports_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

FailureQueue& failure_queue() {
  static auto* queue = new FailureQueue();
  return *queue;
}

// Monitors every ref; each that stops with an error (not a normal stop) is
// reported to failure_queue() under `token` and its position in `refs`.
void watch_failures(const std::vector<PyActorRef>& refs, int64_t token) {
  Runtime& runtime = current_runtime();
  py::gil_scoped_release release;
  for (size_t i = 0; i < refs.size(); ++i) {
    runtime.monitor(refs[i].ref, [token, position = static_cast<int64_t>(i)](const DownEvent& event) {
      if (event.reason.ok()) return;
      failure_queue().push(FailureReport{token, position, event.actor.to_string(),
                                         absl::StatusCodeToString(event.reason.code()) + ": " +
                                             std::string(event.reason.message())});
    });
  }
}

// A future completed (with empty bytes) once every ref has stopped, for any
// reason; monitors are set before the caller stops them.
std::shared_ptr<CallFuture> watch_stopped(const std::vector<PyActorRef>& refs) {
  auto slot = std::make_shared<CallFuture>();
  if (refs.empty()) {
    slot->complete(std::string());
    return slot;
  }
  Runtime& runtime = current_runtime();
  auto left = std::make_shared<std::atomic<size_t>>(refs.size());
  py::gil_scoped_release release;
  for (const PyActorRef& r : refs) {
    runtime.monitor(r.ref, [slot, left](const DownEvent&) {
      if (left->fetch_sub(1) == 1) slot->complete(std::string());
    });
  }
  return slot;
}

}  // namespace

void bind_actors(py::module_& module) {
  py::class_<CallFuture, std::shared_ptr<CallFuture>>(module, "CallFuture",
                                                      "Pending answer of one call (use castmesh.Future).")
      .def("wait", &CallFuture::wait, py::arg("timeout") = -1.0,
           "(done, status code, payload bytes or error text); timeout < 0 waits without limit.")
      .def("add_callback", &CallFuture::add_callback, py::arg("callback"),
           "callback() runs on the completing thread, with the GIL, once the call completes.");
  py::class_<MeshCallFuture, std::shared_ptr<MeshCallFuture>>(
      module, "MeshCallFuture", "Pending answers of a mesh call: a list of payloads in row-major order.")
      .def("wait", &MeshCallFuture::wait, py::arg("timeout") = -1.0,
           "(done, status code, list of payload bytes or error text); timeout < 0 waits without limit.")
      .def("add_callback", &MeshCallFuture::add_callback, py::arg("callback"));

  py::class_<PyReplyStream>(module, "ReplyStream", "Replies of a mesh stream, in arrival order.")
      .def("next", &PyReplyStream::next, py::arg("timeout") = -1.0);

  py::class_<PyActorMesh>(module, "ActorMesh",
                          "castmesh::ActorMesh of Python actor hosts (cast tree, supervision).")
      .def_property_readonly("size", [](const PyActorMesh& m) { return m.mesh.size(); })
      .def("refs", &PyActorMesh::refs)
      .def("select_index", &PyActorMesh::select_index, py::arg("name"), py::arg("index"))
      .def("select_range", &PyActorMesh::select_range, py::arg("name"), py::arg("start"), py::arg("stop"),
           py::arg("step"))
      .def("cast", &PyActorMesh::cast, py::arg("endpoint"), py::arg("payload"))
      .def("call", &PyActorMesh::call, py::arg("endpoint"), py::arg("payload"))
      .def("call_one", &PyActorMesh::call_one, py::arg("endpoint"), py::arg("payload"))
      .def("call_reduce", &PyActorMesh::call_reduce, py::arg("endpoint"), py::arg("payload"), py::arg("op"),
           "One reply piece folded by the C++ reducer op (sum, min, max) along the cast tree.")
      .def(
          "stream",
          [](const PyActorMesh& m, const std::string& endpoint, std::string payload) {
            py::gil_scoped_release release;
            return PyReplyStream{
                std::make_shared<ReplyStream<std::string>>(m.mesh.stream(PyCall{endpoint, std::move(payload)}))};
          },
          py::arg("endpoint"), py::arg("payload"))
      .def("stop", [](const PyActorMesh& m) {
        py::gil_scoped_release release;
        m.mesh.stop();
      });

  module.def("piece_folds", &piece_folds,
             "How many numeric folds of reply pieces this process has done (for tests).");

  py::class_<PyActorRef>(module, "ActorRef", "Address of one Python actor host (castmesh.PyActorHost).")
      .def_static("from_address", &ref_from_address, py::arg("address"))
      .def_property_readonly("address", [](const PyActorRef& r) { return r.ref.address().to_string(); })
      .def_property_readonly("proc", [](const PyActorRef& r) { return r.ref.address().proc; })
      .def("ask", &PyActorRef::ask, py::arg("endpoint"), py::arg("payload"))
      .def("tell", &PyActorRef::tell, py::arg("endpoint"), py::arg("payload"))
      .def("stop", [](const PyActorRef& r) { r.ref.stop(); })
      .def("__repr__", [](const PyActorRef& r) { return "ActorRef(" + r.ref.address().to_string() + ")"; });

  py::class_<ProcMesh>(module, "ProcMesh", "Worker procs of a mesh (castmesh::ProcMesh).")
      .def_property_readonly("size", &ProcMesh::size)
      .def_property_readonly("pids",
                             [](const ProcMesh& m) {
                               std::vector<int64_t> pids;
                               for (const auto& p : m.procs()) pids.push_back(p.pid);
                               return pids;
                             })
      .def_property_readonly("ids",
                             [](const ProcMesh& m) {
                               std::vector<std::string> ids;
                               for (const auto& p : m.procs()) ids.push_back(p.id);
                               return ids;
                             })
      .def(
          "select_index",
          [](const ProcMesh& m, const std::string& name, int64_t index) {
            return value_or_throw(m.slice(name, Selector(index)), ErrorDomain::kValue);
          },
          py::arg("name"), py::arg("index"), "The procs at one index of a dimension (the dimension dropped).")
      .def(
          "select_range",
          [](const ProcMesh& m, const std::string& name, int64_t start, int64_t stop, int64_t step) {
            return value_or_throw(m.slice(name, Selector(Range(start, stop, step))), ErrorDomain::kValue);
          },
          py::arg("name"), py::arg("start"), py::arg("stop"), py::arg("step"),
          "The procs of a range of a dimension (indices normalised by castmesh.Shape).")
      .def("spawn", &spawn_on_mesh, py::arg("name"), py::arg("spec"),
           "Spawns one Python actor host per proc (index = rank).")
      .def("spawn_mesh", &spawn_actor_mesh, py::arg("name"), py::arg("spec"), py::arg("dims"),
           "Spawns one Python actor host per proc as a castmesh::ActorMesh of shape `dims`.")
      .def("stop", [](ProcMesh& m) {
        absl::Status status;
        {
          py::gil_scoped_release release;
          status = m.stop();
        }
        if (!status.ok()) raise_status(status);
      });

  py::class_<PyRuntime>(module, "Runtime", "The controller's castmesh::Runtime.")
      .def(py::init<int, const std::string&, const std::string&, const std::string&>(), py::arg("workers") = 0,
           py::arg("listen") = "", py::arg("secret") = "", py::arg("advertise_host") = "")
      .def("allocate", &PyRuntime::allocate, py::arg("dims"), py::arg("argv"), py::arg("env"),
           py::arg("join_timeout") = 60.0, "Starts worker procs with the LocalAllocator.")
      .def("allocate_rendezvous", &PyRuntime::allocate_rendezvous, py::arg("dims"), py::arg("join_timeout") = 60.0,
           "Waits for procs started by a launcher to join (RendezvousAllocator).")
      .def_property_readonly("address", &PyRuntime::address, "This controller's address (its proc id).")
      .def("has_secret", &PyRuntime::has_secret, py::arg("secret"), "Whether the mesh secret is `secret`.")
      .def(
          "spawn_local",
          [](PyRuntime& rt, const std::string& name, std::string spec, std::optional<uint64_t> index) {
            SpawnOptions options;
            options.name = name;
            options.index = index;
            options.dedicated_thread = true;
            auto ref = rt.runtime().spawn_with<PyActorHost>(std::move(options), std::move(spec));
            if (!ref.ok()) raise_status(ref.status());
            return PyActorRef{std::move(*ref)};
          },
          py::arg("name"), py::arg("spec"), py::arg("index") = py::none(),
          "Spawns a Python actor in the controller (a fixed `index` gives it a well-known address).")
      .def("shutdown", &PyRuntime::shutdown);

  py::class_<PyChannel>(module, "Channel", "A channel opened here: its port actor and message queue.")
      .def_property_readonly("address", &PyChannel::address, "Where senders send (the port actor's address).")
      .def("recv", [](const PyChannel& c) { return c.queue->recv(); }, "A CallFuture of the next message.")
      .def("close", &PyChannel::close, "Stops the port actor; later messages are dropped.");
  module.def("open_channel", &open_channel, "Opens a channel in this process (castmesh.Channel.open).");
  module.def("port_send", &port_send, py::arg("address"), py::arg("payload"),
             "Sends pickled bytes to the port at `address` (fire and forget).");
  module.def("watch_failures", &watch_failures, py::arg("refs"), py::arg("token"),
             "Reports each of these actors that stops with an error to next_failure(), under `token`.");
  module.def(
      "next_failure", [](double timeout) { return failure_queue().next(timeout); }, py::arg("timeout"),
      "(token, position, actor address, reason) of the next failed watched actor, or None after `timeout` s.");
  module.def(
      "close_failures", [] { failure_queue().close(); },
      "At exit: next_failure() returns None at once from now on, and later failures are dropped.");
  module.def("watch_stopped", &watch_stopped, py::arg("refs"),
             "A CallFuture completed once every one of these actors has stopped.");
  module.def(
      "spawn_in_this_proc",
      [](const std::string& name, std::string spec) {
        Runtime* rt = Runtime::current();
        if (rt == nullptr) throw std::runtime_error("no castmesh runtime in this process");
        SpawnOptions options;
        options.name = name;
        options.dedicated_thread = true;
        auto ref = rt->spawn_with<PyActorHost>(std::move(options), std::move(spec));
        if (!ref.ok()) raise_status(ref.status());
        return PyActorRef{std::move(*ref)};
      },
      py::arg("name"), py::arg("spec"), "Spawns a Python actor in the proc running the caller (workers).");

  module.def(
      "erase_from_environment",
      [](const std::string& name) { castmesh::platform::erase_from_environment(name.c_str()); },
      py::arg("name"),
      "Blanks the variable's value in place (the block ps and /proc/<pid>/environ show) and unsets it; for the "
      "worker's secret, main thread, before other threads read the environment.");
  module.def(
      "run_worker",
      [](std::vector<std::string> args) {
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        py::gil_scoped_release release;
        // Serves as a worker proc and exits the process when the controller
        // stops it (returns at once when not started by an allocator).
        castmesh::init(static_cast<int>(args.size()), argv.data());
      },
      py::arg("argv"), "Runs this process as a castmesh worker proc (never returns in a worker).");
}

}  // namespace castmesh::python
