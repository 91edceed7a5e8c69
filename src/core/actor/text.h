// Internal string building. Debian's absl (20220623) has its own
// absl::string_view, distinct from std::string_view, so absl::StrCat and fmt
// cannot take both; str_cat takes either, plus std::string, C strings and
// integers.
#pragma once

#include <absl/strings/string_view.h>

#include <concepts>
#include <string>
#include <string_view>

namespace castmesh::detail {

inline void append_piece(std::string& out, std::string_view s) { out.append(s.data(), s.size()); }
inline void append_piece(std::string& out, const std::string& s) { out.append(s); }
inline void append_piece(std::string& out, const char* s) { out.append(s); }
#ifndef ABSL_USES_STD_STRING_VIEW
inline void append_piece(std::string& out, absl::string_view s) { out.append(s.data(), s.size()); }
#endif
template <std::integral T>
void append_piece(std::string& out, T v) {
  out.append(std::to_string(v));
}

template <typename... Pieces>
std::string str_cat(const Pieces&... pieces) {
  std::string out;
  (append_piece(out, pieces), ...);
  return out;
}

// std::string_view of an absl::string_view (or of itself).
inline std::string_view sv(absl::string_view s) { return std::string_view(s.data(), s.size()); }
#ifndef ABSL_USES_STD_STRING_VIEW
inline std::string_view sv(std::string_view s) { return s; }
#endif
inline absl::string_view av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace castmesh::detail
