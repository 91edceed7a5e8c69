// BodySink: the receiving end of a socket frame's body written in place
// (transport::PayloadSink), one shape for every data path: the body goes
// straight into the memory its receiver names (a posted receive, an RDMA
// read's destination, registered memory or its staging buffer), and what is
// not wanted there (a receive that fails, a read that already finished, a
// chunk outside its range) is read past into scratch memory, so the
// connection stays in step and no byte lands where nobody waits for it.
//
// A path implements receive_wanted() and finish(); the transport's I/O
// thread (or a PeerReader's) calls them, one frame at a time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "core/transport/endpoint.h"

namespace castmesh::link {

class BodySink : public transport::PayloadSink {
 public:
  using Take = std::function<size_t(char* into, size_t max)>;

  size_t receive(size_t at, size_t n, const Take& take) final {
    if (std::optional<size_t> got = receive_wanted(at, n, take)) return *got;
    scratch_.resize(std::min<size_t>(n, kScratchBytes));  // not wanted: read past it
    return take(scratch_.data(), scratch_.size());
  }

 protected:
  // Receives bytes [at, at + n) of the body where they belong, calling
  // `take(into, max)` (max <= n) and returning what it returned; nullopt when
  // they are not wanted (then they are read past).
  virtual std::optional<size_t> receive_wanted(size_t at, size_t n, const Take& take) = 0;

 private:
  static constexpr size_t kScratchBytes = 64 * 1024;
  std::vector<char> scratch_;
};

}  // namespace castmesh::link
