// castmesh::debug::stacks and the text form of a dump (castmesh/debug.h).
#include <future>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "castmesh/debug.h"
#include "core/debug/native_stacks.h"
#include "core/debug/python_stacks.h"
#include "core/debug/stack_dump.h"
#include "core/proc/proc_host.h"
#include "core/proc/typed_request.h"

namespace castmesh::debug {
namespace {

namespace v1 = wire::v1;

// Beyond a proc's own bounds (threads, then symbols), time for the request
// and reply to travel.
constexpr absl::Duration kTransitAllowance = absl::Seconds(5);

ProcStacks ask(proc::ProcHost& host, const ProcInfo& info, const StackOptions& options) {
  v1::StackDumpRequest request;
  request.set_thread_timeout_ms(absl::ToInt64Milliseconds(options.timeout));
  const absl::Duration budget = options.file_lines ? options.symbol_budget : absl::ZeroDuration();
  request.set_symbol_budget_ms(absl::ToInt64Milliseconds(budget));
  absl::StatusOr<v1::StackDumpReply> reply = proc::request_reply<v1::StackDumpReply>(
      host, info.id, request, 2 * options.timeout + budget + kTransitAllowance, "stack dump");
  ProcStacks out;
  if (!reply.ok()) {
    out.status = reply.status();
  } else {
    out = from_wire(*reply);
  }
  out.proc = info;
  if (out.pid == 0) out.pid = info.pid;
  return out;
}

void append_thread(std::string& text, const ThreadStack& t) {
  absl::StrAppend(&text, "  thread ", t.tid, " \"", t.name, "\"");
  if (!t.actor.empty()) {
    absl::StrAppend(&text, "  actor ", t.actor);
    if (!t.actor_class.empty()) absl::StrAppend(&text, " (", t.actor_class, ")");
    absl::StrAppend(&text, t.message_type.empty() ? ", between messages" : ", handling " + t.message_type);
  }
  absl::StrAppend(&text, "\n");
  if (!t.answered) {
    absl::StrAppend(&text, "    (did not answer within the bound: it blocks the dump's signal, is stopped, or "
                           "waits in the kernel uninterruptibly)\n");
    return;
  }
  if (t.has_python) {
    absl::StrAppend(&text, "    python (most recent call first):\n");
    for (const PythonFrame& f : t.python) {
      absl::StrAppend(&text, "      ", f.function, " at ", f.file, ":", f.line == 0 ? "?" : std::to_string(f.line),
                      "\n");
    }
    if (t.python.empty()) absl::StrAppend(&text, "      <no Python frame>\n");
    if (t.python_truncated) absl::StrAppend(&text, "      ...\n");
  }
  absl::StrAppend(&text, "    native (most recent call first):\n");
  for (size_t i = 0; i < t.native.size(); ++i) {
    const NativeFrame& f = t.native[i];
    absl::StrAppend(&text, "      #", i, " 0x", absl::Hex(f.pc), " ", f.function.empty() ? "??" : f.function);
    if (!f.file.empty()) absl::StrAppend(&text, " at ", f.file, ":", f.line);
    const size_t slash = f.object.rfind('/');
    absl::StrAppend(&text, " in ", slash == std::string::npos ? f.object : f.object.substr(slash + 1), "\n");
  }
}

}  // namespace

absl::StatusOr<std::vector<ProcStacks>> stacks(const ProcMesh& mesh, StackOptions options) {
  if (options.timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("stacks: timeout must be positive");
  if (options.symbol_budget < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("stacks: symbol_budget must not be negative");
  }
  std::shared_ptr<proc::ProcHost> host = proc::ProcHost::of(mesh.runtime());
  if (host == nullptr) return absl::FailedPreconditionError("stacks: the mesh's runtime is not a proc");
  // In parallel: a proc that does not answer costs its timeout once, not once per proc.
  std::vector<std::future<ProcStacks>> pending;
  for (const ProcInfo& info : mesh.procs()) {
    pending.push_back(std::async(std::launch::async, [host, info, options] { return ask(*host, info, options); }));
  }
  std::vector<ProcStacks> out;
  for (auto& p : pending) out.push_back(p.get());
  return out;
}

absl::StatusOr<std::vector<ProcStacks>> stacks(const ProcMesh& mesh, absl::Duration timeout) {
  StackOptions options;
  options.timeout = timeout;
  return stacks(mesh, options);
}

ProcStacks this_process_stacks(StackOptions options) {
  ProcStacks out = from_wire(
      dump_this_process(options.timeout, options.file_lines ? options.symbol_budget : absl::ZeroDuration()));
  return out;
}

std::string to_string(const ProcStacks& proc) {
  std::string text;
  if (proc.proc.id.empty()) {
    absl::StrAppend(&text, "this process (pid ", proc.pid, ")\n");
  } else {
    absl::StrAppend(&text, "proc rank ", proc.proc.rank, " pid ", proc.pid, " on ", proc.proc.hostname, " (",
                    proc.proc.id, ")\n");
  }
  if (!proc.status.ok()) {
    absl::StrAppend(&text, "  no dump: ", proc.status.ToString(), "\n");
    return text;
  }
  if (!proc.python_error.empty()) absl::StrAppend(&text, "  no Python stacks: ", proc.python_error, "\n");
  for (const ThreadStack& t : proc.threads) append_thread(text, t);
  return text;
}

int stack_signal() { return native_stack_signal(); }

absl::StatusOr<PythonStackHook> python_stack_hook() {
  absl::StatusOr<PythonDumpTarget> target = python_dump_target();
  if (!target.ok()) return target.status();
  return PythonStackHook{target->signal, target->fd};
}

void python_stack_hook_ready() { set_python_dump_ready(); }

void python_thread_starting(int delta) { note_python_thread_starting(delta); }

std::string to_string(const std::vector<ProcStacks>& procs) {
  std::string text;
  for (const ProcStacks& p : procs) absl::StrAppend(&text, to_string(p), "\n");
  return text;
}

}  // namespace castmesh::debug
