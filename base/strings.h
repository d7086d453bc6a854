// Bounded text for error messages. A request controls the values an error names (a module name,
// a shape, a metadata value); echoed whole, a 10 KB value makes a 10 KB grpc-message, which a
// client with gRPC's default 8 KiB metadata limit sees as RESOURCE_EXHAUSTED "received initial
// metadata size exceeds limit" instead of the real error. So every value quoted in a message goes
// through Elide, and every message leaving the server through BoundMessage.
//
// Thread-safety: pure functions.
#ifndef ATTNSERVE_BASE_STRINGS_H_
#define ATTNSERVE_BASE_STRINGS_H_

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace attnserve {

// The most bytes a value quoted inside a message keeps (Elide's default).
inline constexpr size_t kMaxQuotedValueBytes = 96;
// The most bytes of any error message the server sends (BoundMessage).
inline constexpr size_t kMaxErrorMessageBytes = 512;

// `s` itself when it has at most `max_bytes` bytes; otherwise its start and end around a marker
// that says how much was left out, e.g. "aaaa...[9904 bytes elided]...aaaa", in at most
// `max_bytes` bytes (max_bytes >= 40). Cuts fall between UTF-8 characters.
inline std::string Elide(absl::string_view s, size_t max_bytes = kMaxQuotedValueBytes) {
  if (s.size() <= max_bytes) return std::string(s);
  // The marker's length depends on the count, which depends on the kept length: reserve the
  // longest marker (20 digits) so that the result never exceeds max_bytes.
  constexpr size_t kMarkerBytes = sizeof("...[ bytes elided]...") - 1 + 20;
  const size_t keep = max_bytes > kMarkerBytes ? max_bytes - kMarkerBytes : 0;
  auto is_continuation = [&](size_t i) {
    return i < s.size() && (static_cast<unsigned char>(s[i]) & 0xc0) == 0x80;
  };
  size_t head = keep - keep / 2;  // the first byte not kept at the start
  while (head > 0 && is_continuation(head)) --head;
  size_t tail = s.size() - keep / 2;  // the first byte kept at the end
  while (tail < s.size() && is_continuation(tail)) ++tail;
  return absl::StrCat(s.substr(0, head), "...[", tail - head, " bytes elided]...", s.substr(tail));
}

// `message` bounded to kMaxErrorMessageBytes (see Elide).
inline std::string BoundMessage(absl::string_view message) {
  return Elide(message, kMaxErrorMessageBytes);
}

}  // namespace attnserve

#endif  // ATTNSERVE_BASE_STRINGS_H_
