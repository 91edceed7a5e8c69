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
  absl::StatusOr<std::vector<RawThreadStack>> native = capture_native_stacks(thread_timeout);
  if (!native.ok()) {
    wire::status_to_wire(native.status(), &reply);
    return reply;
  }
  // Python second: its signal goes to this thread only, so the native
  // capture above did not see Python's handler at work.
  std::vector<PythonThread> python;
  if (python_dump_ready()) {
    absl::StatusOr<std::string> text = dump_python_stacks();
    if (text.ok()) {
      python = parse_python_stacks(*text);
    } else {
      reply.set_python_error(std::string(text.status().message()));
    }
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
