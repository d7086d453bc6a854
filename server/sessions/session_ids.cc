// Session ids (SessionInfo.session_id: "<owner>/<instance>/<number>"): the instance name, parsing,
// the order ListSessions pages in, and the status of a lost session.
#include <random>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_manager_internal.h"

namespace attnserve::server::sessions {

std::string RandomInstance() {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) ^ rd();
  return absl::StrFormat("%08x", static_cast<uint32_t>(r ^ (r >> 32)));
}

absl::StatusOr<ParsedId> ParseId(absl::string_view id) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session_id must be \"<owner>/<instance>/<number>\" as CreateSession returned it (", why,
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
  const absl::string_view number = id.substr(last + 1);
  if (p.instance.empty()) return bad("empty instance");
  for (char c : p.instance) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return bad("instance not hex");
  }
  if (number.empty() || number.size() > 19 ||
      !std::all_of(number.begin(), number.end(),
                   [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); }) ||
      !absl::SimpleAtoi(number, &p.number)) {
    return bad("number not decimal");
  }
  return p;
}

absl::Status SessionManager::Lost(absl::string_view reason, absl::string_view id) {
  return absl::FailedPreconditionError(
      absl::StrCat("session lost (", reason, "): session '", id,
                   "' is no longer held by this server; create a new session and prefill it "
                   "again"));
}

std::string SessionManager::LostReason(const absl::Status& status) {
  constexpr absl::string_view kPrefix = "session lost (";
  if (status.code() != absl::StatusCode::kFailedPrecondition ||
      !absl::StartsWith(status.message(), kPrefix)) {
    return "";
  }
  const absl::string_view rest = status.message().substr(kPrefix.size());
  const size_t end = rest.find(')');
  return end == absl::string_view::npos ? "" : std::string(rest.substr(0, end));
}

bool SessionManager::IdOrder::operator()(const std::string& a, const std::string& b) const {
  const size_t ca = a.rfind('/') + 1, cb = b.rfind('/') + 1;  // npos + 1 = 0: no slash
  const absl::string_view pa(a.data(), ca), pb(b.data(), cb);
  if (pa != pb) return pa < pb;
  // Numbers without leading zeros (as issued) compare by length, then digit by digit; any other
  // text after the last slash still orders strictly (by length, then text).
  const size_t na = a.size() - ca, nb = b.size() - cb;
  if (na != nb) return na < nb;
  return absl::string_view(a).substr(ca) < absl::string_view(b).substr(cb);
}

}  // namespace attnserve::server::sessions
