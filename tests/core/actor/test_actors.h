// Small actors shared by the core runtime tests.
#pragma once

#include <castmesh/castmesh.h>

#include <atomic>
#include <string>

namespace castmesh::testing {

struct Add {
  int n = 0;
};
struct Get {};
struct Fail {
  std::string why;
};
struct Echo {
  std::string text;
};

class Counter : public Actor {
 public:
  explicit Counter(int start = 0) : value_(start) {}
  void add(const Add& m) { value_ += m.n; }
  int get(const Get&) const { return value_; }
  std::string echo(Echo m) { return m.text; }
  void fail(const Fail& f) { throw std::runtime_error(f.why); }
  using Handlers = castmesh::Handlers<&Counter::add, &Counter::get, &Counter::echo, &Counter::fail>;

 private:
  int value_;
};

}  // namespace castmesh::testing
