#include "core/proc/spawn_service.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/wire/v1/control.pb.h"
#include "core/log/log.h"
#include "core/proc/actor_registry.h"
#include "core/proc/proc_host.h"
#include "core/proc/remote_supervision.h"
#include "core/wire/status_code.h"

namespace castmesh::proc {

namespace v1 = wire::v1;

SpawnService::SpawnService(ProcHost& host, RemoteSupervision& supervision) : host_(host), supervision_(supervision) {
  host.on_control(v1::SpawnRequest().GetTypeName(),
                  [this](const ProcId& peer, uint64_t correlation, const std::string& payload) {
                    handle_spawn(peer, correlation, payload);
                  });
}

void SpawnService::handle_spawn(const ProcId& peer, uint64_t correlation, const std::string& payload) {
  v1::SpawnReply reply;
  auto fail = [&](const absl::Status& error) { wire::status_to_wire(error, &reply); };
  v1::SpawnRequest request;
  if (!request.ParseFromString(payload)) {
    fail(absl::InvalidArgumentError("malformed SpawnRequest"));
  } else if (auto factory = find_actor_factory(request.actor_type()); !factory) {
    fail(absl::NotFoundError(absl::StrCat("actor type '", request.actor_type(), "' is not registered in proc ",
                                          host_.id(), " (CASTMESH_REGISTER_ACTOR)")));
  } else if (std::vector<std::string>(request.arg_types().begin(), request.arg_types().end()) !=
             factory->arg_types) {
    fail(absl::InvalidArgumentError(absl::StrCat("constructor arguments of '", request.actor_type(),
                                                 "' do not match its registration (",
                                                 absl::StrJoin(factory->arg_types, ", "), ")")));
  } else {
    SpawnOptions options;
    options.name = request.name();
    options.index = request.index();
    std::vector<std::string> args(request.args().begin(), request.args().end());
    absl::StatusOr<Address> address;
    try {
      address = factory->spawn(host_.runtime(), std::move(options), args);
    } catch (const std::exception& e) {
      address = absl::InternalError(absl::StrCat("constructor of '", request.actor_type(), "' threw: ", e.what()));
    }
    if (!address.ok()) {
      fail(address.status());
    } else {
      reply.set_address(address->to_string());
      supervision_.remember_spawned(address->to_string(), peer, request.parent());
    }
  }
  if (absl::Status st = host_.send_control(peer, reply, correlation, /*is_reply=*/true); !st.ok()) {
    CASTMESH_LOG_WARN("castmesh-proc {}: cannot answer spawn request of {}: {}", host_.id(), peer, st.ToString());
  }
}

}  // namespace castmesh::proc
