#include "castmesh/address.h"

#include <absl/strings/numbers.h>
#include "core/actor/text.h"

namespace castmesh {
using detail::str_cat;

std::string Address::to_string() const { return str_cat(proc, "/", name, "[", index, "]"); }

absl::StatusOr<Address> Address::parse(std::string_view text) {
  const auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(str_cat("malformed actor address '", text, "': ", why));
  };
  const size_t slash = text.rfind('/');
  if (slash == std::string_view::npos) return bad("expected proc/name[index]");
  if (text.empty() || text.back() != ']') return bad("missing ']'");
  const size_t open = text.find('[', slash);
  if (open == std::string_view::npos) return bad("missing '['");
  Address a;
  a.proc = std::string(text.substr(0, slash));
  a.name = std::string(text.substr(slash + 1, open - slash - 1));
  if (a.name.empty()) return bad("empty name");
  if (a.name.find_first_of("/[]#") != std::string::npos) return bad("name holds '/', '[', ']' or '#'");
  const std::string_view digits = text.substr(open + 1, text.size() - open - 2);
  if (digits.empty() || !absl::SimpleAtoi(detail::av(digits), &a.index)) return bad("index is not a number");
  return a;
}

std::string PortAddress::to_string() const { return str_cat(owner.to_string(), "#", port); }

absl::StatusOr<PortAddress> PortAddress::parse(std::string_view text) {
  const size_t hash = text.rfind('#');
  if (hash == std::string_view::npos) {
    return absl::InvalidArgumentError(str_cat("malformed port address '", text, "': expected proc/name[index]#port"));
  }
  auto owner = Address::parse(text.substr(0, hash));
  if (!owner.ok()) return owner.status();
  PortAddress p;
  p.owner = std::move(*owner);
  if (!absl::SimpleAtoi(detail::av(text.substr(hash + 1)), &p.port)) {
    return absl::InvalidArgumentError(str_cat("malformed port address '", text, "': port is not a number"));
  }
  return p;
}

std::ostream& operator<<(std::ostream& os, const Address& a) { return os << a.to_string(); }
std::ostream& operator<<(std::ostream& os, const PortAddress& a) { return os << a.to_string(); }

}  // namespace castmesh
