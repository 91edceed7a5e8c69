#include "core/actor/text.h"

#include <exception>

#include "castmesh/detail/mutex.h"
#include "core/actor/running_now.h"
#include "core/actor/runtime_core.h"
#include "absl/container/flat_hash_map.h"
#include "core/log/log.h"
#include "core/trace/recorder.h"

namespace castmesh::detail {

namespace {
// initial-exec: a plain %fs-relative load in this shared library (read on
// every send and turn); a pointer of static TLS, fine for dlopen (Python).
__attribute__((tls_model("initial-exec"))) thread_local ActorCell* tl_cell = nullptr;
// The envelope whose handler runs on this thread (stack dumps read it, see
// core/actor/running_now.h): one store before and one after each message.
__attribute__((tls_model("initial-exec"))) thread_local const Envelope* tl_envelope = nullptr;
// When the last user handler of this turn ended on this thread (0: none
// yet): the next handler's metrics start there, so a message in a batch
// costs one clock read, not two (its time includes taking it from the
// mailbox). Reset at each turn's start and end and after other envelopes.
__attribute__((tls_model("initial-exec"))) thread_local int64_t tl_handler_end_ns = 0;

std::string describe_exception(std::exception_ptr ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// Restores the thread's current cell when a turn ends.
struct CurrentCellScope {
  explicit CurrentCellScope(ActorCell* c) : prev(std::exchange(tl_cell, c)) { tl_handler_end_ns = 0; }
  ~CurrentCellScope() {
    tl_cell = prev;
    tl_handler_end_ns = 0;
  }
  ActorCell* prev;
};

// Marks `env` as the message this thread runs, for the length of its dispatch.
struct CurrentEnvelopeScope {
  explicit CurrentEnvelopeScope(const Envelope* e) : prev(std::exchange(tl_envelope, e)) {}
  ~CurrentEnvelopeScope() { end(); }
  // Ends the mark early (before the envelope is freed).
  void end() { tl_envelope = prev; }
  const Envelope* prev;
};

size_t copy_prefix(std::string_view from, char* to, size_t capacity) noexcept {
  const size_t n = from.size() < capacity ? from.size() : capacity;
  for (size_t i = 0; i < n; ++i) to[i] = from[i];  // no libc call: async-signal-safe by construction
  return from.size();
}
}  // namespace

void read_running_now(RunningNow* out) noexcept {
  const ActorCell* cell = tl_cell;
  out->in_actor = cell != nullptr;
  if (cell == nullptr) return;
  const Address& a = cell->address();
  out->actor_index = a.index;
  out->actor_name_size = copy_prefix(a.name, out->actor_name, sizeof(out->actor_name));
  out->class_name_size = copy_prefix(cell->class_name(), out->class_name, sizeof(out->class_name));
  const Envelope* env = tl_envelope;
  out->in_message = env != nullptr;
  if (env != nullptr) out->message_type = env->type_id;
}

absl::Status actor_stopped_error(const Address& a, const absl::Status& reason) {
  if (reason.ok()) return absl::UnavailableError(str_cat("actor ", a.to_string(), " stopped"));
  return absl::UnavailableError(str_cat("actor ", a.to_string(), " stopped: ", reason.message()));
}

void notify_down(const Watcher& w, const DownEvent& ev) {
  if (w.callback) {
    w.callback(ev);
    return;
  }
  if (auto cell = w.cell.lock()) {
    auto* env = new TypedEnvelope<DownEvent>(ev);
    env->kind = EnvelopeKind::kDown;
    env->type_id = type_id<DownEvent>();
    cell->deliver(env);
  }
}

ActorCell* ActorCell::current() { return tl_cell; }

template <typename F>
void ActorCell::run_guarded(const char* what, std::string_view message_type, F&& fn) {
  try {
    fn();
  } catch (...) {
    fail_from_exception(what, message_type);
  }
}

ActorCell::ActorCell(RuntimeCore* rt, Address address, std::unique_ptr<Actor> actor, const HandlerTable& table,
                     std::shared_ptr<ActorCell> parent)
    : Destination(std::move(address)), rt_(rt), actor_(std::move(actor)), table_(table), parent_(std::move(parent)) {
  actor_->cell_ = this;
}

ActorCell::~ActorCell() = default;

void ActorCell::start(DedicatedThread* thread) {
  self_ = shared_from_this();
  thread_ = thread;
  mailbox_.mark_scheduled();
  schedule();
}

void ActorCell::schedule() {
  if (thread_ != nullptr) {
    thread_->wake();
  } else {
    rt_->scheduler().schedule(this);
  }
}

void ActorCell::deliver(Envelope* env) { push_and_wake(env, /*run_here=*/false); }

void ActorCell::deliver_here(Envelope* env) {
  push_and_wake(env, /*run_here=*/table_.short_handlers && thread_ == nullptr);
}

void ActorCell::push_and_wake(Envelope* env, bool run_here) {
  if (env->kind == EnvelopeKind::kUser) {
    counters_.on_delivered();
    if (ActorCell* sender = current()) sender->counters_.on_sent();
  }
  if (trace::on()) {
    env->trace_queued_ns = trace::now_ns();
    // A message caused by a frame from another proc ends that frame's arrow.
    if (env->trace_flow == 0) env->trace_flow = trace::take_inbound_flow();
  }
  switch (mailbox_.push(env)) {
    case Mailbox::PushResult::kOk:  // queued behind a turn that runs or is scheduled
      return;
    case Mailbox::PushResult::kUnblocked:
      if (run_here) {
        run_one_here();
      } else {
        schedule();
      }
      return;
    case Mailbox::PushResult::kClosed: {
      absl::Status reason;
      {
        detail::MutexLock lock(links_mu_);
        reason = final_reason_;
      }
      reject(env, actor_stopped_error(address(), reason));
      return;
    }
  }
}

void ActorCell::run_one_here() {
  // This thread owns the turn until try_block() or schedule(). A first turn
  // (on_start), a stop or a failure, and whatever queued behind the one
  // message go to a worker: on_start, on_stop and supervision may block.
  if (started_ && !stop_now_.load(std::memory_order_acquire)) {
    CurrentCellScope scope(this);
    const Scheduler::NonBlockingSection promise("an actor with kShortHandlers, running on a transport thread,");
    if (Envelope* env = mailbox_.pop()) dispatch(env);
    if (!stop_requested_ && !failed_ && !stop_now_.load(std::memory_order_acquire) && mailbox_.try_block()) {
      return;  // `this` may run elsewhere from here on
    }
  }
  schedule();
}

Schedulable::TurnResult ActorCell::run_turn(int batch) {
  CurrentCellScope scope(this);
  if (!started_) {
    started_ = true;
    if (!stop_now_.load(std::memory_order_acquire)) {
      run_guarded("on_start", "", [this] { actor_->on_start(); });
    }
  }
  int handled = 0;
  while (handled < batch && !stop_requested_ && !failed_ && !stop_now_.load(std::memory_order_relaxed)) {
    Envelope* env = mailbox_.pop();
    if (env == nullptr) {
      if (mailbox_.try_block()) return TurnResult::kIdle;  // `this` may run elsewhere from here on
      continue;
    }
    dispatch(env);
    ++handled;
  }
  if (stop_requested_ || failed_ || stop_now_.load(std::memory_order_acquire)) {
    finish();
    return TurnResult::kStopped;
  }
  if (mailbox_.try_block()) return TurnResult::kIdle;
  return TurnResult::kMore;
}

void ActorCell::dispatch(Envelope* env) {
  CurrentEnvelopeScope running(env);
  if (env->kind != EnvelopeKind::kUser) tl_handler_end_ns = 0;  // its time is no handler's
  switch (env->kind) {
    case EnvelopeKind::kUser:
      dispatch_user(env);
      break;
    case EnvelopeKind::kStop:
      stop_requested_ = true;
      break;
    case EnvelopeKind::kClosure:
      run_guarded("continuation", "", [env] { static_cast<ClosureEnvelope*>(env)->run(); });
      break;
    case EnvelopeKind::kDown: {
      const auto& ev = static_cast<TypedEnvelope<DownEvent>*>(env)->value;
      run_guarded("on_down", type_name<DownEvent>(), [this, &ev] { actor_->on_down(ev); });
      break;
    }
    case EnvelopeKind::kSupervision: {
      const auto& ev = static_cast<TypedEnvelope<SupervisionEvent>*>(env)->value;
      bool handled = false;
      run_guarded("on_child_failed", type_name<SupervisionEvent>(),
                  [this, &ev, &handled] { handled = actor_->on_child_failed(ev); });
      if (!handled && !failed_) {
        fail(absl::Status(ev.reason.code(),
                          str_cat("unhandled failure of child ", ev.child.to_string(), ": ", ev.reason.message())),
             std::string(type_name<SupervisionEvent>()), ev.origin.empty() ? ev.child : ev.origin);
      }
      break;
    }
  }
  running.end();
  delete env;
}

namespace {

// Records one handler run while a trace records: a slice named by the
// message type (the actor's class as its detail, the time the message
// queued as its value) and, for a message from another proc, the end of the
// sender's flow arrow. Names are interned once per thread.
void trace_handler_run(const Envelope& env, std::string_view class_name, int64_t start_ns) {
  const int64_t end_ns = trace::now_ns();
  thread_local absl::flat_hash_map<uint32_t, uint32_t> type_names;  // by type id: no text to hash
  auto type = type_names.find(env.type_id);
  if (type == type_names.end()) type = type_names.emplace(env.type_id, trace::intern(type_name_of(env.type_id))).first;
  const uint32_t cls = trace::intern_cached(class_name);
  // A handler that serves many endpoints (Python's) names the one it ran.
  const uint32_t named = trace::take_handler_name();
  const uint32_t name = named != 0 ? named : type->second;
  if (env.trace_flow != 0) {
    trace::flow(trace::Category::kSend, trace::RecordKind::kFlowIn, name, env.trace_flow, start_ns);
  }
  const uint64_t queued =
      env.trace_queued_ns != 0 && env.trace_queued_ns < start_ns ? static_cast<uint64_t>(start_ns - env.trace_queued_ns) : 0;
  trace::slice(trace::Category::kHandler, name, start_ns, end_ns, queued, cls);
}

// A failure as an instant in the failed actor's proc: the actor and its class as detail.
void trace_actor_failed(const Address& actor, std::string_view class_name) {
  trace::instant(trace::Category::kSupervision, trace::intern_cached("actor failed"), trace::now_ns(), 0,
                 trace::intern(str_cat(actor.to_string(), " (", class_name, ")")));
}

}  // namespace

void ActorCell::dispatch_user(Envelope* env) {
  counters_.on_taken();
  if (env->reply && env->reply.get()->cancelled()) {  // cancelled before it started
    tl_handler_end_ns = 0;
    return;
  }
  HandlerFn fn = env->handler;
  if (fn == nullptr || env->handler_class != table_.class_id) {
    const HandlerEntry* entry = table_.find(env->type_id);
    fn = entry ? entry->fn : nullptr;
  }
  if (fn == nullptr) {
    absl::Status err = absl::UnimplementedError(str_cat("actor ", address().to_string(), " (", table_.class_name,
                                                             ") has no handler for message type ",
                                                             type_name_of(env->type_id)));
    if (env->reply) {
      env->reply.complete_error(std::move(err));
    } else {
      CASTMESH_LOG_WARN("{}; message dropped", sv(err.message()));
    }
    tl_handler_end_ns = 0;
    return;
  }
  // The handler's metrics start where the turn's last handler ended (one clock read per message).
  const int64_t start_ns = tl_handler_end_ns != 0 ? tl_handler_end_ns : trace::now_ns();
  const int64_t trace_start_ns = trace::on() ? trace::now_ns() : 0;
  try {
    fn(actor_.get(), env);
  } catch (...) {
    const std::string_view mtype = type_name_of(env->type_id);
    absl::Status reason =
        absl::InternalError(str_cat("handler for ", mtype, " threw: ", describe_exception(std::current_exception())));
    env->reply.complete_error(
        absl::AbortedError(str_cat("actor ", address().to_string(), " failed: ", reason.message())));
    fail(std::move(reason), std::string(mtype), address());
  }
  const int64_t end_ns = trace::now_ns();
  tl_handler_end_ns = end_ns;
  counters_.on_handled(end_ns - start_ns);
  if (trace_start_ns != 0) trace_handler_run(*env, table_.class_name, trace_start_ns);
}

void ActorCell::fail_from_exception(const char* what, std::string_view message_type) {
  fail(absl::InternalError(str_cat(what, " threw: ", describe_exception(std::current_exception()))),
       std::string(message_type), address());
}

void ActorCell::fail(absl::Status reason, std::string message_type, Address origin) {
  if (failed_) return;
  failed_ = true;
  failure_ = std::move(reason);
  failure_message_type_ = std::move(message_type);
  failure_origin_ = std::move(origin);
  // Info: the failure goes on to the parent or the runtime's handler, which
  // report it (an error log where nobody handles it, RuntimeCore::report_unhandled).
  CASTMESH_LOG_INFO("actor {} failed: {}", address().to_string(), sv(failure_.message()));
}

void ActorCell::untrack_timer(TimerId id) { std::erase(timers_, id); }

void ActorCell::request_stop_now(absl::Status reason) {
  {
    detail::MutexLock lock(links_mu_);
    if (stopped_) return;
    if (stop_now_reason_.ok()) stop_now_reason_ = std::move(reason);
  }
  stop_now_.store(true, std::memory_order_release);
  auto* env = new Envelope();
  env->kind = EnvelopeKind::kStop;
  deliver(env);  // wakes the actor; dropped if it already closed
}

void ActorCell::add_watcher(Watcher w) {
  absl::Status reason;
  {
    detail::MutexLock lock(links_mu_);
    if (!stopped_) {
      watchers_.push_back(std::move(w));
      return;
    }
    reason = final_reason_;
  }
  notify_down(w, DownEvent{address(), reason});
}

bool ActorCell::remove_watcher(MonitorId id) {
  detail::MutexLock lock(links_mu_);
  return std::erase_if(watchers_, [id](const Watcher& w) { return w.id == id; }) > 0;
}

bool ActorCell::add_child(std::shared_ptr<ActorCell> child) {
  detail::MutexLock lock(links_mu_);
  if (stopped_) return false;
  children_.push_back(std::move(child));
  return true;
}

void ActorCell::remove_child(ActorCell* child) {
  detail::MutexLock lock(links_mu_);
  std::erase_if(children_, [child](const auto& c) { return c.get() == child; });
}

void ActorCell::finish() {
  std::shared_ptr<ActorCell> keep = std::move(self_);  // released last: may destroy this cell
  absl::Status reason;
  if (failed_) {
    reason = failure_;
  } else if (stop_now_.load(std::memory_order_acquire)) {
    detail::MutexLock lock(links_mu_);
    reason = stop_now_reason_;
  }
  if (started_) {
    try {
      actor_->on_stop();
    } catch (...) {
      CASTMESH_LOG_ERROR("actor {}: on_stop threw: {}", address().to_string(),
                         describe_exception(std::current_exception()));
    }
  }
  for (TimerId id : timers_) rt_->timers().cancel(id);
  timers_.clear();

  std::shared_ptr<ActorCell> parent;
  std::vector<std::shared_ptr<ActorCell>> children;
  std::vector<Watcher> watchers;
  {
    detail::MutexLock lock(links_mu_);
    stopped_ = true;
    final_reason_ = reason;
    parent = std::move(parent_);
    children.swap(children_);
    watchers.swap(watchers_);
  }
  // Refuse further messages (senders fail at once from here on); the
  // requests still queued fail last, once everything else is done.
  Envelope* queued = mailbox_.close();
  actor_.reset();

  for (auto& child : children) {
    child->request_stop_now(absl::UnavailableError(str_cat("parent ", address().to_string(), " stopped")));
  }
  const DownEvent down{address(), reason, failed_ ? failure_message_type_ : std::string()};
  for (const auto& w : watchers) notify_down(w, down);

  if (failed_) {
    if (trace::on()) trace_actor_failed(address(), table_.class_name);
    SupervisionEvent ev{address(), reason, failure_message_type_, failure_origin_};
    bool delivered = false;
    if (parent) {
      auto* env = new TypedEnvelope<SupervisionEvent>(ev);
      env->kind = EnvelopeKind::kSupervision;
      env->type_id = type_id<SupervisionEvent>();
      delivered = parent->mailbox_push_system(env);
    }
    if (!delivered) rt_->report_unhandled(ev);
  }
  if (parent) parent->remove_child(this);
  CASTMESH_LOG_DEBUG("actor {} stopped{}{}", address().to_string(), reason.ok() ? "" : ": ", sv(reason.message()));
  // Built only when requests are queued: most actors stop with an empty
  // mailbox, and this string was a quarter of the cost of a spawn/stop.
  const absl::Status dropped = queued != nullptr ? actor_stopped_error(address(), reason) : absl::OkStatus();
  RuntimeCore* rt = rt_;
  rt->on_cell_stopped(this);
  for (Envelope* env = queued; env != nullptr;) {
    Envelope* next = env->next;
    env->reply.complete_error(dropped);
    delete env;
    env = next;
  }
}

bool ActorCell::mailbox_push_system(Envelope* env) {
  switch (mailbox_.push(env)) {
    case Mailbox::PushResult::kOk:
      return true;
    case Mailbox::PushResult::kUnblocked:
      schedule();
      return true;
    case Mailbox::PushResult::kClosed:
      delete env;
      return false;
  }
  return false;
}

}  // namespace castmesh::detail
