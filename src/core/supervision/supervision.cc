#include "castmesh/supervision.h"

#include "core/actor/text.h"

namespace castmesh {
using detail::str_cat;

std::string SupervisionEvent::to_string() const {
  std::string out = str_cat("actor ", child.to_string(), " failed");
  if (!message_type.empty()) out += str_cat(" handling ", message_type);
  out += str_cat(": ", reason.ToString());
  if (!origin.empty() && origin != child) out += str_cat(" (origin ", origin.to_string(), ")");
  return out;
}

}  // namespace castmesh
