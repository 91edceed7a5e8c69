#include "core/debug/stack_dump.h"

#include <unistd.h>

#include <string>

#include "absl/container/flat_hash_map.h"
#include "castmesh/message.h"
#include "core/debug/native_stacks.h"
#include "core/debug/python_stacks.h"
#include "core/debug/symbolizer.h"
#include "core/wire/status_code.h"

namespace castmesh::debug {

wire::v1::StackDumpReply dump_this_process(absl::Duration thread_timeout, absl::Duration symbol_budget) {
  wire::v1::StackDumpReply reply;
  reply.set_pid(getpid());
  // Python's stacks are written while the other threads are held still in
  // the native capture's handler: faulthandler reads every thread's frames
  // without the GIL, and frames that change under it can crash it.
  // A few tries: Python's dump is skipped while a Python thread starts
  // (python_stacks.h), which takes microseconds.
  const bool has_python = python_dump_ready();
  bool python_raised = false;
  absl::StatusOr<std::vector<RawThreadStack>> native;
  for (int attempt = 0; attempt < 5; ++attempt) {
    native = capture_native_stacks(
        thread_timeout, has_python ? std::function<void()>([&python_raised] { python_raised = raise_python_dump(); })
                                   : std::function<void()>());
    if (!native.ok() || !has_python || python_raised) break;
  }
  if (!native.ok()) {
    wire::status_to_wire(native.status(), &reply);
    return reply;
  }
  std::vector<PythonThread> python;
  if (python_raised) {
    absl::StatusOr<std::string> text = read_python_dump();
    if (text.ok()) {
      python = parse_python_stacks(*text);
    } else {
      reply.set_python_error(std::string(text.status().message()));
    }
  } else if (has_python) {
    reply.set_python_error("no Python dump: a Python thread was starting at every try (CPython cannot dump then)");
  }
  absl::flat_hash_map<uint64_t, const PythonThread*> python_by_ident;
  for (const PythonThread& t : python) python_by_ident[t.ident] = &t;

  // Every frame of every thread in one symbolize() call (one addr2line run per object).
  std::vector<uintptr_t> pcs;
  std::vector<bool> is_return;
  for (const RawThreadStack& t : *native) {
    for (size_t f = 0; f < t.pcs.size(); ++f) {
      pcs.push_back(t.pcs[f]);
      is_return.push_back(f > 0);  // the innermost frame is where the signal landed, the rest return addresses
    }
  }
  const std::vector<Symbol> symbols =
      symbolize(pcs, is_return, symbol_budget > absl::ZeroDuration(), symbol_budget);

  size_t next_symbol = 0;
  for (const RawThreadStack& t : *native) {
    wire::v1::ThreadStackDump* out = reply.add_threads();
    out->set_tid(t.tid);
    out->set_name(t.name);
    out->set_answered(t.answered);
    out->set_python_ident(t.pthread_id);
    for (uintptr_t pc : t.pcs) {
      const Symbol& s = symbols[next_symbol++];
      wire::v1::StackFrame* frame = out->add_native();
      frame->set_pc(pc);
      frame->set_function(s.function);
      frame->set_object(s.object);
      frame->set_offset(s.offset);
      frame->set_file(s.file);
      frame->set_line(s.line);
    }
    if (!t.answered) continue;
    const detail::RunningNow& r = t.running;
    if (r.in_actor) {
      std::string name(r.actor_name, std::min(r.actor_name_size, sizeof(r.actor_name)));
      if (r.actor_name_size > sizeof(r.actor_name)) name += "...";
      out->set_actor(name + "[" + std::to_string(r.actor_index) + "]");
      out->set_actor_class(std::string(r.class_name, std::min(r.class_name_size, sizeof(r.class_name))));
      if (r.in_message) {
        const std::string_view type = detail::type_name_of(r.message_type);
        out->set_message_type(type.empty() ? "type#" + std::to_string(r.message_type) : std::string(type));
      }
    }
    auto it = python_by_ident.find(t.pthread_id);
    if (it != python_by_ident.end()) {
      out->set_has_python(true);
      out->set_python_truncated(it->second->truncated);
      for (const PythonThread::Frame& f : it->second->frames) {
        wire::v1::PythonFrame* frame = out->add_python();
        frame->set_file(f.file);
        frame->set_line(f.line);
        frame->set_function(f.function);
      }
    }
  }
  return reply;
}

ProcStacks from_wire(const wire::v1::StackDumpReply& reply) {
  ProcStacks out;
  out.pid = reply.pid();
  out.status = wire::status_from_wire(reply);
  out.python_error = reply.python_error();
  for (const wire::v1::ThreadStackDump& t : reply.threads()) {
    ThreadStack& ts = out.threads.emplace_back();
    ts.tid = t.tid();
    ts.name = t.name();
    ts.answered = t.answered();
    for (const wire::v1::StackFrame& f : t.native()) {
      ts.native.push_back(NativeFrame{f.pc(), f.function(), f.object(), f.offset(), f.file(), f.line()});
    }
    ts.has_python = t.has_python();
    for (const wire::v1::PythonFrame& f : t.python()) ts.python.push_back(PythonFrame{f.file(), f.line(), f.function()});
    ts.python_truncated = t.python_truncated();
    ts.actor = t.actor();
    ts.actor_class = t.actor_class();
    ts.message_type = t.message_type();
  }
  return out;
}

}  // namespace castmesh::debug
