// PyCall: the one message of a Python actor host (and of a channel's port
// actor), with its wire codec registered under "castmesh.python.PyCall".
#pragma once

#include <string>

namespace castmesh::python {

// One call of a Python endpoint: its name and pickle.dumps((args, kwargs)).
// `oneway`: sent by broadcast (tell), nobody reads the reply, so the host
// logs an exception instead. Plain value.
struct PyCall {
  std::string endpoint;
  std::string payload;
  bool oneway = false;
};

}  // namespace castmesh::python
