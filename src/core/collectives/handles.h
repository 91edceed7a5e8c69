// Makes communicator.h's Request and Communicator handles over the
// collectives' private state. Their constructors over that state are
// private (this class is their friend) so that the public header offers
// user code nothing that names detail::RequestState, DeviceWork or CommGroup.
//
// Plain functions; any thread.
#pragma once

#include <memory>
#include <utility>

#include "castmesh/communicator.h"

namespace castmesh::collectives_internal {

class Handles {
 public:
  // A request over `state` (a host operation).
  static Request request(std::shared_ptr<detail::RequestState> state) { return Request(std::move(state)); }
  // A collective on device buffers: `work` orders streams after it.
  static Request device_request(std::shared_ptr<detail::RequestState> state,
                                std::shared_ptr<detail::DeviceWork> work) {
    return Request(std::move(state), std::move(work));
  }
  // A user handle of `group` (counted among its user handles).
  static Communicator communicator(std::shared_ptr<detail::CommGroup> group) {
    return Communicator(std::move(group));
  }
};

}  // namespace castmesh::collectives_internal
