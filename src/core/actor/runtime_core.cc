#include "core/actor/runtime_core.h"

#include "castmesh/detail/mutex.h"
#include "core/actor/text.h"

#include <thread>

#include "core/log/log.h"

namespace castmesh::detail {

namespace {
// initial-exec: see tl_cell in actor_cell.cc.
__attribute__((tls_model("initial-exec"))) thread_local RuntimeCore* tl_runtime = nullptr;
// Live runtimes in creation order; a plain thread's current runtime is the
// most recently created one still alive.
detail::Mutex g_runtimes_mu;
std::vector<RuntimeCore*>& live_runtimes() {
  static auto* v = new std::vector<RuntimeCore*>();
  return *v;
}

// "ns::Foo<int>" -> "Foo".
std::string default_name(std::string_view class_name) {
  std::string_view n = class_name.substr(0, class_name.find('<'));
  const size_t colon = n.rfind("::");
  if (colon != std::string_view::npos) n = n.substr(colon + 2);
  std::string out(n);
  for (char& c : out) {
    if (c == '/' || c == '[' || c == ']' || c == '#' || c == ' ') c = '_';
  }
  return out.empty() ? std::string("actor") : out;
}

// An address nothing lives at (or a spawn refused during shutdown).
class DeadDestination final : public Destination {
 public:
  DeadDestination(Address a, absl::Status why) : Destination(std::move(a)), why_(std::move(why)) {}
  void deliver(Envelope* env) override { reject(env, why_); }

 private:
  absl::Status why_;
};

class UnresolvedDestination final : public Destination {
 public:
  using Destination::Destination;
  void deliver(Envelope* env) override {
    RuntimeCore* rt = RuntimeCore::current();
    if (rt == nullptr) {
      reject(env, absl::FailedPreconditionError(
                      str_cat("no runtime on this thread to resolve actor ", address().to_string())));
      return;
    }
    rt->resolve(address())->deliver(env);
  }
};

// The answer port of a request from another proc (or a OncePort decoded
// from bytes). Answering encodes the value and routes it back.
class RemoteReplySink final : public ReplySink {
 public:
  RemoteReplySink(PortAddress port, uint32_t value_type, RuntimeCore* rt)
      : port_(std::move(port)), value_type_(value_type), rt_(rt) {}

  void add_promise() override { promises_.fetch_add(1, std::memory_order_relaxed); }
  void drop_promise() override {
    if (promises_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      if (!done_.load(std::memory_order_acquire)) {
        complete_error(absl::AbortedError("request dropped without a reply"));
      }
      delete this;
    }
  }
  uint32_t value_type() const override { return value_type_; }
  bool cancelled() const override { return false; }
  PortAddress port_address() override { return port_; }

  void complete_value(uint32_t type, void* value) override {
    if (done_.exchange(true, std::memory_order_acq_rel)) return;
    if (value_type_ != 0 && type != value_type_) {
      send_error(type_mismatch(type_name_of(type), type_name_of(value_type_)));
      return;
    }
    RuntimeCore* rt = runtime();
    if (rt == nullptr) return;
    if (port_.owner.proc == rt->proc_id()) {  // our own port, handed around: no bytes needed
      if (ReplySink* sink = rt->take_reply(port_.port)) {
        sink->complete_value(type, value);
        sink->drop_promise();
      }
      return;
    }
    const MessageCodec* codec = codec_for(type);
    if (codec == nullptr) {
      send_error(absl::FailedPreconditionError(str_cat("reply type ", type_name_of(type),
                                                            " has no codec (CASTMESH_REGISTER_MESSAGE)")));
      return;
    }
    WireMessage m;
    m.destination = port_.owner;
    m.port = port_.port;
    m.type_name = codec->wire_name;
    if (absl::Status st = codec->encode(value, &m.payload); !st.ok()) {
      send_error(st);
      return;
    }
    route(rt, std::move(m));
  }
  void complete_error(absl::Status status) override {
    if (done_.exchange(true, std::memory_order_acq_rel)) return;
    send_error(std::move(status));
  }

 private:
  RuntimeCore* runtime() const {
    RuntimeCore* rt = rt_ ? rt_ : RuntimeCore::current();
    if (rt == nullptr) CASTMESH_LOG_ERROR("reply to {} lost: no runtime on this thread", port_.to_string());
    return rt;
  }
  void send_error(absl::Status status) {
    RuntimeCore* rt = runtime();
    if (rt == nullptr) return;
    if (port_.owner.proc == rt->proc_id()) {
      rt->fail_reply_port(port_, std::move(status));
      return;
    }
    WireMessage m;
    m.destination = port_.owner;
    m.port = port_.port;
    m.error = status.ok() ? absl::UnknownError("empty error") : std::move(status);
    route(rt, std::move(m));
  }
  static void route(RuntimeCore* rt, WireMessage m) {
    auto router = rt->router();
    if (!router) {
      CASTMESH_LOG_WARN("reply to {} dropped: no RemoteRouter installed", PortAddress{m.destination, m.port}.to_string());
      return;
    }
    router->route(std::move(m));
  }

  const PortAddress port_;
  const uint32_t value_type_;
  RuntimeCore* const rt_;
  std::atomic<int32_t> promises_{0};
  std::atomic<bool> done_{false};
};
}  // namespace

// ---- free functions used by the public headers ----

std::shared_ptr<Destination> unresolved_destination(Address address) {
  return std::make_shared<UnresolvedDestination>(std::move(address));
}

void reject(Envelope* env, absl::Status status) {
  if (env->reply) {
    env->reply.complete_error(std::move(status));
  } else if (env->kind == EnvelopeKind::kUser) {
    CASTMESH_LOG_DEBUG("message {} dropped: {}", type_name_of(env->type_id), sv(status.message()));
  }
  delete env;
}

void post(Destination& target, Envelope* closure) { target.deliver(closure); }

void request_stop(Destination& target) {
  if (auto* cell = dynamic_cast<ActorCell*>(&target)) {
    auto* env = new Envelope();
    env->kind = EnvelopeKind::kStop;
    cell->mailbox_push_system(env);
    return;
  }
  auto* env = new Envelope();
  env->kind = EnvelopeKind::kStop;
  target.deliver(env);
}

ReplySink* make_remote_reply_sink(PortAddress port, uint32_t value_type) {
  return new RemoteReplySink(std::move(port), value_type, nullptr);
}

absl::StatusOr<std::shared_ptr<Destination>> spawn_actor(RuntimeCore* rt, ActorCell* parent,
                                                      std::unique_ptr<Actor> actor, const HandlerTable& table,
                                                      SpawnOptions options) {
  return rt->spawn(parent, std::move(actor), table, std::move(options));
}

// ---- RuntimeCore ----

RuntimeCore::RuntimeCore(Runtime* owner_runtime, RuntimeOptions opts)
    : owner(owner_runtime), options(std::move(opts)), proc_id_(options.proc_id.empty() ? "local" : options.proc_id) {
  int workers = options.workers;
  if (workers <= 0) workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  scheduler_ = std::make_unique<Scheduler>(workers, options.batch, [this] { on_thread_start(); });
  detail::MutexLock lock(g_runtimes_mu);
  live_runtimes().push_back(this);
}

RuntimeCore::~RuntimeCore() {
  shutdown();
  detail::MutexLock lock(g_runtimes_mu);
  std::erase(live_runtimes(), this);
}

void RuntimeCore::on_thread_start() { tl_runtime = this; }

RuntimeCore* RuntimeCore::current() {
  if (tl_runtime) return tl_runtime;
  if (ActorCell* cell = ActorCell::current()) return cell->runtime();  // a turn on a transport thread
  detail::MutexLock lock(g_runtimes_mu);
  return live_runtimes().empty() ? nullptr : live_runtimes().back();
}

absl::Status RuntimeCore::set_proc_id(ProcId id) {
  if (spawned_any_.load()) return absl::FailedPreconditionError("set_proc_id after actors were spawned");
  if (id.empty()) return absl::InvalidArgumentError("empty proc id");
  proc_id_ = std::move(id);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Destination>> RuntimeCore::spawn(ActorCell* parent, std::unique_ptr<Actor> actor,
                                                             const HandlerTable& table, SpawnOptions options) {
  // default_name() already replaces those characters; only a given name is checked.
  const bool given_name = !options.name.empty();
  std::string name = given_name ? std::move(options.name) : default_name(table.class_name);
  if (given_name && name.find_first_of("/[]#") != std::string::npos) {
    return absl::InvalidArgumentError(str_cat("actor name '", name, "' holds '/', '[', ']' or '#'"));
  }
  const uint64_t index = options.index ? *options.index : next_index_.fetch_add(1, std::memory_order_relaxed);
  Address address{proc_id_, std::move(name), index};
  spawned_any_.store(true, std::memory_order_relaxed);
  if (shutting_down()) {
    return std::shared_ptr<Destination>(
        std::make_shared<DeadDestination>(std::move(address), absl::UnavailableError("runtime is shutting down")));
  }
  std::shared_ptr<ActorCell> parent_ref = parent ? parent->shared_from_this() : nullptr;
  auto cell = std::make_shared<ActorCell>(this, address, std::move(actor), table, parent_ref);
  {
    DirectoryShard& sh = shard(address.index);
    detail::MutexLock lock(sh.mu);
    auto [it, inserted] = sh.cells.try_emplace(std::make_pair(address.name, address.index), cell);
    if (!inserted) {
      if (!it->second.expired()) {
        return absl::AlreadyExistsError(str_cat("an actor ", address.to_string(), " already exists"));
      }
      it->second = cell;
    }
  }
  live_.fetch_add(1, std::memory_order_acq_rel);
  DedicatedThread* thread = nullptr;
  if (options.dedicated_thread) {
    detail::MutexLock lock(threads_mu_);
    dedicated_.push_back(std::make_unique<DedicatedThread>(cell.get(), this->options.batch,
                                                           [this] { on_thread_start(); }));
    thread = dedicated_.back().get();
  }
  const bool orphan = parent_ref && !parent_ref->add_child(cell);
  cell->start(thread);
  if (orphan) cell->request_stop_now(absl::UnavailableError("parent stopped before the child started"));
  return std::shared_ptr<Destination>(std::move(cell));
}

std::shared_ptr<ActorCell> RuntimeCore::find_local(const Address& address) {
  if (address.proc != proc_id_) return nullptr;
  DirectoryShard& sh = shard(address.index);
  detail::MutexLock lock(sh.mu);
  auto it = sh.cells.find(std::make_pair(address.name, address.index));
  return it == sh.cells.end() ? nullptr : it->second.lock();
}

std::shared_ptr<Destination> RuntimeCore::resolve(const Address& address) {
  if (address.proc != proc_id_) return std::make_shared<RemoteDestination>(this, address);
  if (auto cell = find_local(address)) return cell;
  return std::make_shared<DeadDestination>(address, absl::NotFoundError(str_cat("no actor ", address.to_string())));
}

void RuntimeCore::on_cell_stopped(ActorCell* cell) {
  {
    DirectoryShard& sh = shard(cell->address().index);
    detail::MutexLock lock(sh.mu);
    auto it = sh.cells.find(std::make_pair(cell->address().name, cell->address().index));
    if (it != sh.cells.end()) {
      auto held = it->second.lock();
      if (!held || held.get() == cell) sh.cells.erase(it);
    }
  }
  if (live_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    detail::MutexLock lock(live_mu_);
    live_cv_.notify_all();
  }
}

std::vector<std::shared_ptr<ActorCell>> RuntimeCore::live_cells() {
  std::vector<std::shared_ptr<ActorCell>> cells;
  for (auto& sh : directory_) {
    detail::MutexLock lock(sh.mu);
    for (auto& [key, weak] : sh.cells) {
      if (auto c = weak.lock()) cells.push_back(std::move(c));
    }
  }
  return cells;
}

void RuntimeCore::report_unhandled(const SupervisionEvent& ev) {
  // A handler reports the failure itself (a worker forwards it to the actor's
  // spawner): logged here too, each failure would print once per proc.
  if (options.on_unhandled_failure) {
    CASTMESH_LOG_DEBUG("actor failure with no parent here, to the handler: {}", ev.to_string());
    options.on_unhandled_failure(ev);
    return;
  }
  CASTMESH_LOG_ERROR("unhandled actor failure: {}", ev.to_string());
}

void RuntimeCore::shutdown() {
  if (ActorCell::current() != nullptr || scheduler_->on_worker_thread()) {
    CASTMESH_LOG_ERROR("Runtime::shutdown() called from inside an actor; only requesting every actor to stop");
    shutting_down_.store(true, std::memory_order_release);
    for (auto& c : live_cells()) c->request_stop_now(absl::UnavailableError("runtime shutting down"));
    return;
  }
  if (shut_down_.exchange(true)) return;
  shutting_down_.store(true, std::memory_order_release);
  timers_.stop();
  // Actors spawned concurrently with this loop are caught on a later round.
  while (live_.load(std::memory_order_acquire) > 0) {
    for (auto& c : live_cells()) c->request_stop_now(absl::UnavailableError("runtime shutting down"));
    detail::MutexLock lock(live_mu_);
    live_cv_.wait_for(lock, absl::Milliseconds(50), [this] { return live_.load() == 0; });
  }
  scheduler_->stop();
  std::vector<std::unique_ptr<DedicatedThread>> threads;
  {
    detail::MutexLock lock(threads_mu_);
    threads.swap(dedicated_);
  }
  threads.clear();  // joins
  absl::flat_hash_map<uint64_t, PendingReply> ports;
  {
    detail::MutexLock lock(ports_mu_);
    ports.swap(ports_);
  }
  for (auto& [id, p] : ports) {
    p.sink->complete_error(absl::UnavailableError("runtime shut down"));
    p.sink->drop_promise();
  }
  set_router(nullptr);
  {
    detail::MutexLock lock(watch_mu_);
    remote_watchers_.clear();
  }
}

// ---- remote seam ----

std::shared_ptr<RemoteRouter> RuntimeCore::router() {
  detail::MutexLock lock(router_mu_);
  return router_;
}

void RuntimeCore::set_router(std::shared_ptr<RemoteRouter> r) {
  std::shared_ptr<RemoteRouter> old;
  {
    detail::MutexLock lock(router_mu_);
    old = std::exchange(router_, std::move(r));
  }
}

uint64_t RuntimeCore::register_reply(ReplySink* sink, ProcId destination) {
  sink->add_promise();
  detail::MutexLock lock(ports_mu_);
  const uint64_t id = next_port_++;
  ports_.emplace(id, PendingReply{sink, std::move(destination)});
  return id;
}

ReplySink* RuntimeCore::take_reply(uint64_t port) {
  detail::MutexLock lock(ports_mu_);
  auto it = ports_.find(port);
  if (it == ports_.end()) return nullptr;
  ReplySink* sink = it->second.sink;
  ports_.erase(it);
  return sink;
}

void RuntimeCore::fail_pending_to_proc(const ProcId& proc, const absl::Status& error) {
  std::vector<ReplySink*> failed;
  {
    detail::MutexLock lock(ports_mu_);
    for (auto it = ports_.begin(); it != ports_.end();) {
      if (it->second.destination == proc) {
        failed.push_back(it->second.sink);
        ports_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (ReplySink* s : failed) {
    s->complete_error(error);
    s->drop_promise();
  }
}

void RuntimeCore::watch_remote(const Address& actor, Watcher w) {
  bool first = false;
  {
    detail::MutexLock lock(watch_mu_);
    std::vector<Watcher>& watchers = remote_watchers_[actor];
    first = watchers.empty();
    watchers.push_back(std::move(w));
  }
  if (!first) return;  // the router already watches it
  if (auto r = router()) {
    r->watch(actor);
  } else {
    report_remote_down(actor, absl::UnavailableError(str_cat("cannot monitor ", actor.to_string(), ": no route to proc ",
                                                             actor.proc, " (no RemoteRouter installed)")));
  }
}

bool RuntimeCore::unwatch_remote(const Address& actor, MonitorId id) {
  detail::MutexLock lock(watch_mu_);
  auto it = remote_watchers_.find(actor);
  if (it == remote_watchers_.end()) return false;
  const bool removed = std::erase_if(it->second, [id](const Watcher& w) { return w.id == id; }) > 0;
  // With no watcher left, a later monitor asks the router again; the
  // router's answer about this watch, if any, then finds nobody.
  if (it->second.empty()) remote_watchers_.erase(it);
  return removed;
}

MonitorId RuntimeCore::monitor(const UntypedRef& target, Watcher w) {
  w.id = next_monitor_.fetch_add(1, std::memory_order_relaxed);
  const MonitorId id = w.id;
  if (!target.valid()) {
    notify_down(w, DownEvent{{}, absl::InvalidArgumentError("monitor of an empty ref")});
    return id;
  }
  const Address& a = target.address();
  if (a.proc != proc_id()) {
    watch_remote(a, std::move(w));
  } else if (auto cell = find_local(a)) {
    cell->add_watcher(std::move(w));
  } else {
    notify_down(w, DownEvent{a, absl::NotFoundError("no actor " + a.to_string())});
  }
  return id;
}

bool RuntimeCore::demonitor(const UntypedRef& target, MonitorId id) {
  if (!target.valid() || id == 0) return false;
  const Address& a = target.address();
  if (a.proc != proc_id()) return unwatch_remote(a, id);
  auto cell = find_local(a);
  return cell != nullptr && cell->remove_watcher(id);
}

void RuntimeCore::report_remote_down(const Address& actor, const absl::Status& reason, std::string message_type) {
  std::vector<RemoteDown> downs(1);
  {
    detail::MutexLock lock(watch_mu_);
    auto it = remote_watchers_.find(actor);
    if (it == remote_watchers_.end()) return;
    downs[0].watchers = std::move(it->second);
    remote_watchers_.erase(it);
  }
  downs[0].event = DownEvent{actor, reason, std::move(message_type)};
  notify_remote_down(std::move(downs));
}

void RuntimeCore::report_proc_down(const ProcId& proc, const absl::Status& reason) {
  fail_pending_to_proc(proc, reason);
  std::vector<RemoteDown> downs;
  {
    detail::MutexLock lock(watch_mu_);
    for (auto it = remote_watchers_.begin(); it != remote_watchers_.end();) {
      if (it->first.proc == proc) {
        downs.push_back(RemoteDown{DownEvent{it->first, reason}, std::move(it->second)});
        remote_watchers_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  notify_remote_down(std::move(downs));
}

void RuntimeCore::notify_remote_down(std::vector<RemoteDown> downs) {
  if (downs.empty()) return;
  auto shared = std::make_shared<std::vector<RemoteDown>>(std::move(downs));
  const TimerId timer = timers_.add(absl::ZeroDuration(), absl::ZeroDuration(), [this, shared] {
    tl_runtime = this;  // the timer thread is this runtime's: Runtime::current() in a callback is right
    for (const RemoteDown& d : *shared) {
      for (const Watcher& w : d.watchers) notify_down(w, d.event);
    }
  });
  if (timer == 0) {
    CASTMESH_LOG_DEBUG("runtime shutting down: down event of {} not delivered", (*shared)[0].event.actor.to_string());
  }
}

absl::Status RuntimeCore::deliver_serialized(const Address& dst, std::string_view type_name, std::string_view bytes,
                                             const std::optional<PortAddress>& reply_to, const Address& sender,
                                             bool may_run_here) {
  ReplyRef reply;
  if (reply_to) reply = ReplyRef(new RemoteReplySink(*reply_to, 0, this));
  const auto fail = [&](absl::Status st) {
    reply.complete_error(st);
    return st;
  };
  if (dst.proc != proc_id_) {
    return fail(absl::InvalidArgumentError(
        str_cat("message for ", dst.to_string(), " delivered to proc ", proc_id_)));
  }
  auto cell = find_local(dst);
  if (!cell) return fail(absl::NotFoundError(str_cat("no actor ", dst.to_string())));
  if (type_name == kStopWireName) {
    request_stop(*cell);
    return absl::OkStatus();
  }
  uint32_t tid = 0;
  const MessageCodec* codec = codec_for_wire_name(type_name, &tid);
  if (codec == nullptr) {
    return fail(absl::UnimplementedError(str_cat("actor ", dst.to_string(), ": unknown message type '",
                                                      type_name, "' (no codec registered in this proc)")));
  }
  void* payload = nullptr;
  Envelope* env = codec->make_envelope(&payload);
  if (absl::Status st = codec->decode(bytes, payload); !st.ok()) {
    delete env;
    return fail(absl::InvalidArgumentError(
        str_cat("message ", type_name, " for ", dst.to_string(), " could not be decoded: ", st.message())));
  }
  env->type_id = tid;
  env->reply = std::move(reply);
  (void)sender;  // kept for logging by the transport; actors do not see senders
  if (may_run_here && ActorCell::current() == nullptr) {
    cell->deliver_here(env);
  } else {
    cell->deliver(env);
  }
  return absl::OkStatus();
}

absl::Status RuntimeCore::deliver_serialized_reply(const PortAddress& port, std::string_view type_name,
                                                   std::string_view bytes) {
  if (port.owner.proc != proc_id_) {
    return absl::InvalidArgumentError(str_cat("reply for ", port.to_string(), " delivered to proc ", proc_id_));
  }
  ReplySink* sink = take_reply(port.port);
  if (sink == nullptr) {
    return absl::NotFoundError(str_cat("no pending reply port ", port.to_string(), " (answered, or unknown)"));
  }
  uint32_t tid = sink->value_type();
  const MessageCodec* codec = tid != 0 ? codec_for(tid) : codec_for_wire_name(type_name, &tid);
  absl::Status st;
  if (codec == nullptr) {
    st = absl::UnimplementedError(str_cat("reply type '", type_name, "' has no codec in this proc"));
  } else if (codec->wire_name != type_name) {
    st = absl::InvalidArgumentError(
        str_cat("reply of type '", type_name, "' for a request expecting '", codec->wire_name, "'"));
  } else {
    void* value = codec->create();
    st = codec->decode(bytes, value);
    if (st.ok()) sink->complete_value(tid, value);
    codec->destroy(value);
  }
  if (!st.ok()) sink->complete_error(st);
  sink->drop_promise();
  return st;
}

void RuntimeCore::fail_reply_port(const PortAddress& port, absl::Status error) {
  if (port.owner.proc != proc_id_) return;
  if (ReplySink* sink = take_reply(port.port)) {
    sink->complete_error(std::move(error));
    sink->drop_promise();
  }
}

// ---- RemoteDestination ----

void RemoteDestination::deliver(Envelope* env) {
  WireMessage m;
  m.destination = address();
  if (ActorCell* me = ActorCell::current()) {
    m.sender = me->address();
    if (env->kind == EnvelopeKind::kUser) me->counters().on_sent();
  }
  if (env->kind == EnvelopeKind::kStop) {
    m.type_name = std::string(kStopWireName);
  } else if (env->kind != EnvelopeKind::kUser) {
    delete env;  // internal envelopes never cross procs
    return;
  } else {
    const MessageCodec* codec = codec_for(env->type_id);
    if (codec == nullptr) {
      reject(env, absl::FailedPreconditionError(str_cat(
                      "message type ", type_name_of(env->type_id), " to ", address().to_string(),
                      " has no codec: use a protobuf message or CASTMESH_REGISTER_MESSAGE")));
      return;
    }
    m.type_name = codec->wire_name;
    if (absl::Status st = codec->encode(env->payload(), &m.payload); !st.ok()) {
      reject(env, st);
      return;
    }
  }
  auto router = rt_->router();
  if (!router) {
    reject(env, absl::UnavailableError(
                    str_cat("no route to proc ", address().proc, " (no RemoteRouter installed)")));
    return;
  }
  uint64_t port = 0;
  if (env->reply) {
    port = rt_->register_reply(env->reply.get(), address().proc);
    m.reply_to = PortAddress{rt_->reply_owner(), port};
  }
  env->reply.reset();
  delete env;
  router->route(std::move(m));
}

}  // namespace castmesh::detail
