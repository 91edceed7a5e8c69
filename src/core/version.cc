#include "castmesh/version.h"

namespace castmesh {
const char* version() { return CASTMESH_VERSION_STRING; }
}  // namespace castmesh
