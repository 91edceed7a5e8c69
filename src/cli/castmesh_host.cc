// castmesh-host: the host agent of one machine (docs/hosts.md). A
// controller attaches to it (castmesh.attach_to_workers, castmesh::HostMesh)
// and has it start, kill and report procs; it serves one controller at a
// time and kills that controller's procs when it goes. Python's
// run_worker_loop_forever and `python -m castmesh.host` are the same agent.
//
//   CASTMESH_SECRET_FILE=~/.castmesh/secret castmesh-host --address tcp://0.0.0.0:26600
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "castmesh/host_mesh.h"

namespace {

constexpr char kUsage[] =
    "usage: castmesh-host --address tcp://HOST:PORT [--host-identity ID] [--python PYTHON]\n"
    "                     [--ca FILE --cert FILE --key FILE]\n"
    "  --address        where to listen: tcp://HOST:PORT, tcp://0.0.0.0:PORT (every interface), or\n"
    "                   tcp://ADVERTISE@0.0.0.0:PORT; port 0 picks a free one (printed)\n"
    "  --host-identity  this host's identity for same-host data paths (default: boot id + namespaces)\n"
    "  --python         the Python that runs Python controllers' workers (default: $CASTMESH_PYTHON or python3)\n"
    "  --ca/--cert/--key  mutual TLS 1.3: the CA file, this host's certificate and its private key\n"
    "                   (mode 0600); its procs use the same files (docs/security.md)\n"
    "The mesh secret comes from CASTMESH_SECRET or CASTMESH_SECRET_FILE (mode 0600), never the command line.\n";

}  // namespace

int main(int argc, char** argv) {
  castmesh::HostAgentOptions options;
  const char* python_env = std::getenv("CASTMESH_PYTHON");
  std::string python = python_env != nullptr && *python_env != '\0' ? python_env : "python3";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "castmesh-host: %s needs a value\n%s", argv[i], kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--address") {
      options.address = value();
    } else if (arg == "--host-identity") {
      options.host_identity = value();
    } else if (arg == "--python") {
      python = value();
    } else if (arg == "--ca") {
      options.ca = value();
    } else if (arg == "--cert") {
      options.cert = value();
    } else if (arg == "--key") {
      options.private_key = value();
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "castmesh-host: unknown argument '%s'\n%s", argv[i], kUsage);
      return 2;
    }
  }
  if (options.address.empty()) {
    std::fprintf(stderr, "castmesh-host: --address is required\n%s", kUsage);
    return 2;
  }
  options.worker_argv = {python, "-m", "castmesh._worker"};
  options.on_listening = [](const std::string& address) {
    std::printf("castmesh host agent listening at %s\n", address.c_str());
    std::fflush(stdout);
  };
  absl::Status status = castmesh::run_host_agent(std::move(options));
  if (!status.ok()) {
    std::fprintf(stderr, "castmesh-host: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
