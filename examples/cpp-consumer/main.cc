// Lists the castmesh backends this machine has, with each one's state.
//
//   castmesh_list_backends [--require NAME]...
//
// Exits 1 if a backend given with --require was not found at all (its
// library is missing); a backend found without a device is fine.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// The umbrella header: also checks that every header it includes is installed.
#include "castmesh/castmesh.h"

int main(int argc, char** argv) {
  std::vector<std::string> required;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--require") == 0 && i + 1 < argc) {
      required.emplace_back(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--require NAME]...\n", argv[0]);
      return 2;
    }
  }

  std::printf("castmesh %s (headers %s)\n", castmesh::version(), CASTMESH_VERSION_STRING);
  int missing = 0;
  for (const castmesh::BackendInfo& backend : castmesh::backends()) {
    std::printf("backend %-14s %-16s %s\n", backend.name.c_str(),
                std::string(castmesh::backend_state_name(backend.state)).c_str(),
                backend.path.empty() ? "-" : backend.path.c_str());
    if (!backend.message.empty()) std::printf("    why: %s\n", backend.message.c_str());
    for (const castmesh::DeviceInfo& device : backend.devices) {
      std::printf("    device %d: %s, %llu bytes, %s\n", device.index, device.name.c_str(),
                  static_cast<unsigned long long>(device.memory_bytes), device.detail.c_str());
    }
    for (const std::string& name : required) {
      if (name == backend.name && backend.state == castmesh::BackendState::kLibraryMissing) ++missing;
    }
  }
  if (missing > 0) {
    std::fprintf(stderr, "%d required backend(s) not found\n", missing);
    return 1;
  }
  return 0;
}
