// Session ids (SessionInfo.session_id: "<owner>/<instance>/<key>"): the instance name, the random
// key, parsing, and the status of a lost session.
#include <sys/random.h>

#include <algorithm>
#include <random>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/session_errors.h"
#include "server/batching/pushback.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_manager_internal.h"

namespace attnserve::server::sessions {

std::string RandomKey() {
  uint8_t bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {  // getrandom blocks only before the kernel's pool is seeded
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

std::string RandomInstance() {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) ^ rd();
  return absl::StrFormat("%08x", static_cast<uint32_t>(r ^ (r >> 32)));
}

absl::StatusOr<ParsedId> ParseId(absl::string_view id) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session_id must be \"<owner>/<instance>/<key>\" as CreateSession returned it (", why,
        "); was '", id.substr(0, kMaxIdChars), id.size() > kMaxIdChars ? "...'" : "'"));
  };
  if (id.empty()) return bad("empty");
  if (id.size() > kMaxIdChars) return bad("longer than 256 characters");
  const size_t last = id.rfind('/');
  if (last == absl::string_view::npos || last == 0) return bad("no '/'");
  const size_t mid = id.rfind('/', last - 1);
  if (mid == absl::string_view::npos || mid == 0) return bad("one '/' only");
  ParsedId p;
  p.owner = id.substr(0, mid);
  p.instance = id.substr(mid + 1, last - mid - 1);
  p.key = id.substr(last + 1);
  if (p.instance.empty()) return bad("empty instance");
  for (char c : p.instance) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return bad("instance not hex");
  }
  if (p.key.size() != 32 || !std::all_of(p.key.begin(), p.key.end(), [](char c) {
        return absl::ascii_isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
      })) {
    return bad("key not 32 lowercase hex digits");
  }
  return p;
}

absl::Status SessionManager::Lost(absl::string_view reason, absl::string_view id) {
  return absl::FailedPreconditionError(
      absl::StrCat(kSessionLostPrefix, reason, "): session '", id,
                   "' is no longer held by this server; create a new session and prefill it "
                   "again"));
}

std::string SessionManager::LostReason(const absl::Status& status) {
  return LostSessionReason(status);
}

absl::Status SessionManager::Moved(absl::string_view id, absl::string_view to) {
  auto parsed = ParseId(to);
  const absl::string_view owner = parsed.ok() ? parsed->owner : absl::string_view("?");
  return absl::FailedPreconditionError(absl::StrCat(
      kSessionMovedPrefix, to, "': session '", id, "' was moved to replica '", owner,
      "'; send its calls there under its new id (the bundled clients do so themselves)"));
}

std::string SessionManager::MovedTo(const absl::Status& status) { return MovedSessionId(status); }

absl::Status SessionManager::Moving(absl::string_view id) {
  // One session's pages cross the network meanwhile: milliseconds for most.
  return batching::WithPushback(
      absl::UnavailableError(absl::StrCat("session '", id,
                                          "' is moving to another replica: retry shortly (it "
                                          "answers \"session moved to\" its new id then)")),
      absl::Milliseconds(20));
}

}  // namespace attnserve::server::sessions
