// attnserve::Session: one decode session held by a server (see the proto's "Decode sessions"),
// closed when the object goes away.
//
//   attnserve::HeadLayout layout;
//   layout.num_heads = 8, layout.num_kv_heads = 2, layout.head_dim = 64;
//   auto session = attnserve::Session::CreateRaw(client.get(), layout);
//   // prefill: q [P, 8, 64], k and v [P, 2, 64], token-major
//   auto prefill = session->Extend(q, k, v);
//   for (int t = 0; t < steps; ++t) {
//     auto step = session->Extend(q1, k1, v1);       // one token: [1, 8, 64], [1, 2, 64]
//     ... step->output() [1, 8, 64] ...
//   }
//   auto beam = session->Fork();                      // shares the pages copy-on-write
//   // ~Session closes both
//
// Safe retries: every extend carries expected_length (the tokens this object knows the session
// holds), so an extend repeated after a lost response (gRPC's retry policy, ClientOptions::retry,
// or the caller's own) cannot append twice: the server refuses the repeat ABORTED. Extend then
// asks the server for the session's length and, when the earlier attempt was applied, says so
// (ABORTED, "applied by an earlier attempt") with length() brought up to date.
//
// A lost session (evicted, expired, or its server restarted) answers FAILED_PRECONDITION
// "session lost (<reason>): ..."; IsSessionLost (client/client.h) recognises it. Create a new
// session and prefill it again.
#ifndef ATTNSERVE_CLIENT_SESSION_H_
#define ATTNSERVE_CLIENT_SESSION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"

namespace attnserve {

// How a raw session's heads are laid out (the proto's HeadLayout).
struct HeadLayout {
  int num_heads = 0;     // Hq; a multiple of num_kv_heads. REQUIRED.
  int num_kv_heads = 0;  // Hkv. Default (0): num_heads.
  int head_dim = 0;      // D of q and k. REQUIRED.
  int v_head_dim = 0;    // Dv of v and the output. Default (0): head_dim.
};

// What CreateRaw and CreateForModule ask for besides the binding.
struct SessionOptions {
  // Element type of the cache. Default: FLOAT32.
  v1::Dtype cache_dtype = v1::DTYPE_FLOAT32;
  // Multiplier of q·k. Default: 1/sqrt(D).
  std::optional<float> scale;
  // Never evicted (it may still expire). Default: false.
  bool pinned = false;
  // Idle time after which the session is lost. Default (zero): the server's.
  absl::Duration idle_ttl = absl::ZeroDuration();
  // Score modifications (attention.proto, CreateSessionRequest): a sliding window of
  // window_left keys before each token's position (-1: none), a logit soft-cap (0: none), ALiBi
  // with the standard slopes or with one slope per query head (empty: none).
  int window_left = -1;
  float softcap = 0.0f;
  bool alibi_standard = false;
  std::vector<float> alibi_slopes;
  // The kind of attention: ATTENTION_KIND_LINEAR for a linear-attention session (its state only,
  // O(D·Dv) bytes a kv head whatever its length; no score modifications, no scale), with its
  // feature map (unset: elu + 1). Default: softmax.
  v1::AttentionKind kind = v1::ATTENTION_KIND_UNSPECIFIED;
  v1::FeatureMap feature_map = v1::FEATURE_MAP_UNSPECIFIED;
  // Deadline of each call the Session makes. Default (zero): ClientOptions::timeout.
  absl::Duration timeout = absl::ZeroDuration();
};

// Not thread-safe: use a Session from one thread at a time (a session's extends are applied one
// at a time anyway). Distinct Sessions, and the Client they share, may be used concurrently.
// The Client must outlive its Sessions.
class Session {
 public:
  // A session the caller feeds projected q [L, Hq, D], k [L, Hkv, D], v [L, Hkv, Dv].
  static absl::StatusOr<Session> CreateRaw(Client* client, const HeadLayout& layout,
                                           const SessionOptions& options = {});
  // A session bound to the loaded module `module`: the caller feeds inputs [L, d_model].
  static absl::StatusOr<Session> CreateForModule(Client* client, const std::string& module,
                                                 const SessionOptions& options = {});
  // From a complete request.
  static absl::StatusOr<Session> Create(Client* client, const v1::CreateSessionRequest& request,
                                        absl::Duration timeout = absl::ZeroDuration());

  Session(Session&& other) noexcept;
  Session& operator=(Session&& other) noexcept;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  // Closes the session unless Close or Release was called; errors are ignored.
  ~Session();

  // Its id: the one created, or its new one once an extend found it moved to another replica
  // (the Client follows moves: client.h).
  const std::string& id() const { return info_.session_id(); }
  // Tokens the session holds, as far as this object knows (updated by every extend and
  // Describe).
  int64_t length() const { return info_.length(); }
  // The state as created, or as the last Describe returned it (length kept current).
  const v1::SessionInfo& info() const { return info_; }

  // Appends tokens (a prefill of many or one decode step) and returns their attention over the
  // whole cache. Raw sessions: q [L, Hq, D], k [L, Hkv, D], v [L, Hkv, Dv], one dtype.
  absl::StatusOr<v1::ExtendSessionResponse> Extend(const v1::Tensor& query, const v1::Tensor& key,
                                                   const v1::Tensor& value,
                                                   bool return_lse = false);
  // Module sessions: inputs [L, d_model].
  absl::StatusOr<v1::ExtendSessionResponse> Extend(const v1::Tensor& input,
                                                   bool return_lse = false);
  // Any request: session_id is filled in, and expected_length unless the request sets it.
  absl::StatusOr<v1::ExtendSessionResponse> Extend(v1::ExtendSessionRequest request);

  // The request to send for this session elsewhere (ExtendSessions, a stream): `request` with
  // session_id and expected_length filled in. Give the response to Applied.
  v1::ExtendSessionRequest Prepare(v1::ExtendSessionRequest request) const;
  // Records an extend's response obtained elsewhere (its length).
  void Applied(const v1::ExtendSessionResponse& response);

  // A new session holding the same tokens, sharing the pages copy-on-write. `idle_ttl` zero:
  // the parent's.
  absl::StatusOr<Session> Fork(bool pinned = false, absl::Duration idle_ttl = absl::ZeroDuration());
  // The server's view of the session; updates info() and length().
  absl::StatusOr<v1::SessionInfo> Describe();
  // Ends the session and frees its pages. After it (even when it fails: a lost session is
  // gone anyway) the destructor does nothing.
  absl::Status Close();
  // Gives up ownership: the destructor will not close the session. Returns its id.
  std::string Release();

 private:
  Session(Client* client, v1::SessionInfo info, absl::Duration timeout)
      : client_(client), info_(std::move(info)), timeout_(timeout) {}

  Client* client_ = nullptr;  // null once closed, released or moved from
  v1::SessionInfo info_;
  absl::Duration timeout_;
};

// One step per session in one ExtendSessions call (split per replica by the Client): steps[i]
// extends *steps[i].first with steps[i].second (prepared as Session::Prepare does). Each
// item's result, in order; a session's length is updated when its item succeeds. The call
// fails as a whole only for errors of the call itself (and INVALID_ARGUMENT for an empty list
// or a session given twice).
absl::StatusOr<std::vector<absl::StatusOr<v1::ExtendSessionResponse>>> ExtendSessions(
    Client* client, const std::vector<std::pair<Session*, v1::ExtendSessionRequest>>& steps,
    absl::Duration timeout = absl::ZeroDuration());

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_SESSION_H_
