// attnserve-cli: sends one request to an attnserve server and prints a summary and the Timing.
//
//   attnserve-cli [--target=localhost:50051] info
//   attnserve-cli modules
//   attnserve-cli attend --shape=B,Hq,Lq,D [--kv_heads=H] [--kv_len=L] [--dtype=float16]
//                        [--causal] [--weights]
//   attnserve-cli mha [--module=demo] --shape=B,L [--causal] [--weights]
//   attnserve-cli seed --file=tests/data/seed-vectors/causal.safetensors
//   attnserve-cli session [--module=demo | --layout=Hq,Hkv,D] [--prefill=P | --file=F]
//                         [--steps=N] [--dtype=...] [--cache_dtype=...]
//
// attend, mha and session also take the kinds of attention: --window=LEFT,RIGHT (a session:
// LEFT,0), --softcap=CAP, --alibi (the standard slopes), --kind=linear [--feature_map=relu].
//
// Security: --tls_ca_file (turns TLS on; the CA that signed the server's certificate),
// --tls_cert_file/--tls_key_file (mutual TLS), --tls_server_name (name the certificate is checked
// against, for IP targets), --auth_token_file (sent as "authorization: Bearer <token>").
//
// `attend` and `mha` send random tensors (fixed seed); `seed` loads a seed-vector file's module
// through LoadModule, sends its inputs and mask, and compares the answer with the expected
// output and weights stored in the file (exit status 1 when the error exceeds --tolerance).
// `session` creates a decode session (bound to --module, or raw with --layout), prefills it
// with --prefill random tokens or with a safetensors --file (tensors "input" [P, d_model] for
// a module session; "query" [P, Hq, D], "key" and "value" [P, Hkv, D] for a raw one), runs
// --steps decode steps of one random token, prints each step's latency (as the client saw it,
// and the server's) and their p50/p99 and tokens/s, and closes the session.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "base/flags_usage.h"
#include "client/client.h"
#include "client/session.h"
#include "model/safetensors.h"

ABSL_FLAG(std::string, target, "localhost:50051", "server address (gRPC target)");
ABSL_FLAG(std::string, shape, "", "attend: B,Hq,Lq,D; mha: B,L");
ABSL_FLAG(int, kv_heads, 0, "attend: key/value heads (default Hq)");
ABSL_FLAG(int, kv_len, 0, "attend: key length (default Lq)");
ABSL_FLAG(std::string, dtype, "float32", "float32, float16 or bfloat16");
ABSL_FLAG(bool, causal, false, "causal masking");
ABSL_FLAG(bool, weights, false, "ask for the attention weights");
ABSL_FLAG(std::string, module, "demo", "mha: module name");
ABSL_FLAG(std::string, window, "",
          "attend, mha: a sliding window LEFT,RIGHT (-1: a side left open); session: LEFT,0");
ABSL_FLAG(double, softcap, 0, "attend, mha, session: logit soft-cap (0: none)");
ABSL_FLAG(bool, alibi, false, "attend, mha, session: ALiBi with the standard slopes");
ABSL_FLAG(std::string, kind, "softmax", "attend, mha, session: softmax or linear attention");
ABSL_FLAG(std::string, feature_map, "",
          "linear attention's feature map: elu_plus_one (default), relu or identity");
ABSL_FLAG(std::string, file, "",
          "seed: a seed-vector safetensors file; session: the prefill's tensors");
ABSL_FLAG(double, tolerance, 1e-5, "seed: largest absolute error accepted");
ABSL_FLAG(std::string, layout, "", "session: a raw session's Hq,Hkv,D (default: --module's)");
ABSL_FLAG(int64_t, prefill, 16, "session: random prefill tokens (when no --file)");
ABSL_FLAG(int64_t, steps, 8, "session: decode steps of one token after the prefill");
ABSL_FLAG(std::string, cache_dtype, "", "session: the cache's dtype (default: --dtype)");
ABSL_FLAG(int64_t, timeout_ms, 60000, "deadline of the call");
ABSL_FLAG(std::string, tls_ca_file, "",
          "PEM CA certificate(s) to verify the server with; setting it turns TLS on");
ABSL_FLAG(bool, tls, false, "TLS with the system's root certificates (implied by --tls_ca_file)");
ABSL_FLAG(std::string, tls_cert_file, "", "PEM client certificate chain (mutual TLS)");
ABSL_FLAG(std::string, tls_key_file, "", "PEM client private key (mutual TLS)");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the server's certificate is checked against (default: the target's host)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding a bearer token (surrounding whitespace ignored)");

namespace {

namespace v1 = attnserve::v1;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  return 1;
}

std::vector<float> Random(int64_t n, std::mt19937* rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(*rng);
  return v;
}

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void PrintTensor(const char* name, const v1::Tensor& t) {
  auto values = attnserve::TensorToFloats(t);
  if (!values.ok()) {
    std::printf("%s: %s\n", name, values.status().ToString().c_str());
    return;
  }
  double sum = 0, abs_max = 0;
  for (float x : *values) {
    sum += x;
    abs_max = std::max(abs_max, std::fabs(static_cast<double>(x)));
  }
  std::vector<std::string> head;
  for (size_t i = 0; i < std::min<size_t>(4, values->size()); ++i) {
    head.push_back(absl::StrCat((*values)[i]));
  }
  std::printf("%s: %s [%s]  mean %.6g  max|x| %.6g  first [%s ...]\n", name,
              v1::Dtype_Name(t.dtype()).c_str(), absl::StrJoin(t.shape(), ", ").c_str(),
              values->empty() ? 0.0 : sum / values->size(), abs_max,
              absl::StrJoin(head, ", ").c_str());
}

void PrintTiming(const v1::Timing& t) {
  std::printf("timing: queued %lld us, compute %lld us, server %lld us, batch of %d, backend %s\n",
              static_cast<long long>(t.queued_us()), static_cast<long long>(t.compute_us()),
              static_cast<long long>(t.server_us()), t.batch_size(), t.backend().c_str());
}

// An Attend or MultiHeadAttention answer printed: its output, its weights when asked for, its
// timing; or its error. The exit code.
template <typename Response>
int PrintAnswer(const absl::StatusOr<Response>& response) {
  if (!response.ok()) return Fail(response.status());
  PrintTensor("output", response->output());
  if (response->has_weights()) PrintTensor("weights", response->weights());
  PrintTiming(response->timing());
  return 0;
}

absl::StatusOr<v1::Dtype> ParseDType(const std::string& s) {
  if (s == "float32") return v1::DTYPE_FLOAT32;
  if (s == "float16") return v1::DTYPE_FLOAT16;
  if (s == "bfloat16") return v1::DTYPE_BFLOAT16;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype must be float32, float16 or "
                   "bfloat16; was '",
                   s, "'"));
}

absl::StatusOr<std::vector<int64_t>> ParseShape(size_t rank) {
  std::vector<int64_t> shape;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_shape), ',')) {
    int64_t d;
    if (!absl::SimpleAtoi(part, &d)) {
      return absl::InvalidArgumentError(absl::StrCat("--shape: '", part, "' is not a number"));
    }
    shape.push_back(d);
  }
  if (shape.size() != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shape needs ", rank, " numbers; got '", absl::GetFlag(FLAGS_shape), "'"));
  }
  return shape;
}

// --window, --softcap, --alibi, --kind and --feature_map (attention.proto, AttentionOptions and
// CreateSessionRequest), validated here only as far as parsing goes: the server names what it
// refuses.
struct Kinds {
  std::optional<std::pair<int, int>> window;
  float softcap = 0;
  bool alibi = false;
  v1::AttentionKind kind = v1::ATTENTION_KIND_UNSPECIFIED;
  v1::FeatureMap feature_map = v1::FEATURE_MAP_UNSPECIFIED;
};

absl::StatusOr<Kinds> ParseKinds() {
  Kinds k;
  if (const std::string w = absl::GetFlag(FLAGS_window); !w.empty()) {
    const std::vector<std::string> sides = absl::StrSplit(w, ',');
    int left = 0, right = 0;
    if (sides.size() != 2 || !absl::SimpleAtoi(sides[0], &left) ||
        !absl::SimpleAtoi(sides[1], &right)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--window needs LEFT,RIGHT (two integers); got '", w, "'"));
    }
    k.window = {left, right};
  }
  k.softcap = static_cast<float>(absl::GetFlag(FLAGS_softcap));
  k.alibi = absl::GetFlag(FLAGS_alibi);
  if (const std::string kind = absl::GetFlag(FLAGS_kind); kind == "linear") {
    k.kind = v1::ATTENTION_KIND_LINEAR;
  } else if (kind != "softmax") {
    return absl::InvalidArgumentError(
        absl::StrCat("--kind must be softmax or linear; got '", kind, "'"));
  }
  if (const std::string map = absl::GetFlag(FLAGS_feature_map); !map.empty()) {
    const std::optional<v1::FeatureMap> named = attnserve::FeatureMapNamed(map);
    if (!named.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--feature_map must be elu_plus_one, relu or identity; got '", map, "'"));
    }
    k.feature_map = *named;
  }
  return k;
}

absl::Status SetOptions(v1::AttentionOptions* options) {
  options->set_causal(absl::GetFlag(FLAGS_causal));
  options->set_return_weights(absl::GetFlag(FLAGS_weights));
  auto k = ParseKinds();
  if (!k.ok()) return k.status();
  if (k->window.has_value()) {
    options->mutable_window()->set_left(k->window->first);
    options->mutable_window()->set_right(k->window->second);
  }
  options->set_softcap(k->softcap);
  if (k->alibi) options->mutable_alibi()->set_standard(true);
  options->set_kind(k->kind);
  options->set_feature_map(k->feature_map);
  return absl::OkStatus();
}

int Attend(attnserve::Client& client, absl::Duration timeout) {
  auto shape = ParseShape(4);
  if (!shape.ok()) return Fail(shape.status());
  auto dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return Fail(dtype.status());
  const int64_t b = (*shape)[0], hq = (*shape)[1], lq = (*shape)[2], d = (*shape)[3];
  const int64_t hkv = absl::GetFlag(FLAGS_kv_heads) > 0 ? absl::GetFlag(FLAGS_kv_heads) : hq;
  const int64_t lk = absl::GetFlag(FLAGS_kv_len) > 0 ? absl::GetFlag(FLAGS_kv_len) : lq;
  std::mt19937 rng(1);
  v1::AttendRequest request;
  *request.mutable_query() = attnserve::MakeTensor(*dtype, *shape, Random(Product(*shape), &rng));
  const std::vector<int64_t> kv_shape = {b, hkv, lk, d};
  *request.mutable_key() = attnserve::MakeTensor(*dtype, kv_shape, Random(Product(kv_shape), &rng));
  *request.mutable_value() =
      attnserve::MakeTensor(*dtype, kv_shape, Random(Product(kv_shape), &rng));
  if (absl::Status st = SetOptions(request.mutable_options()); !st.ok()) return Fail(st);
  return PrintAnswer(client.Attend(request, timeout));
}

int MultiHead(attnserve::Client& client, absl::Duration timeout) {
  auto shape = ParseShape(2);
  if (!shape.ok()) return Fail(shape.status());
  auto dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return Fail(dtype.status());
  auto modules = client.ListModules(timeout);
  if (!modules.ok()) return Fail(modules.status());
  int64_t d_model = 0;
  for (const auto& m : modules->modules()) {
    if (m.name() == absl::GetFlag(FLAGS_module)) d_model = m.d_model();
  }
  if (d_model == 0) {
    return Fail(absl::NotFoundError(
        absl::StrCat("no module '", absl::GetFlag(FLAGS_module), "' on the server")));
  }
  std::mt19937 rng(1);
  v1::MultiHeadAttentionRequest request;
  request.set_module(absl::GetFlag(FLAGS_module));
  const std::vector<int64_t> q_shape = {(*shape)[0], (*shape)[1], d_model};
  *request.mutable_query() = attnserve::MakeTensor(*dtype, q_shape, Random(Product(q_shape), &rng));
  if (absl::Status st = SetOptions(request.mutable_options()); !st.ok()) return Fail(st);
  return PrintAnswer(client.MultiHeadAttention(request, timeout));
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double{a[i]} - b[i]));
  return m;
}

int Seed(attnserve::Client& client, absl::Duration timeout) {
  namespace k = attnserve::model;
  const std::string path = absl::GetFlag(FLAGS_file);
  auto bytes = attnserve::ReadFileToString(path);
  if (!bytes.ok()) return Fail(bytes.status());
  auto file = k::ParseSafetensors(*bytes);
  if (!file.ok()) return Fail(file.status());

  v1::LoadModuleRequest load;
  load.set_name("seed");
  load.set_safetensors(*bytes);
  load.set_replace(true);
  auto loaded = client.LoadModule(load, timeout);
  if (!loaded.ok()) return Fail(loaded.status());

  auto tensor = [&](const char* name) -> absl::StatusOr<v1::Tensor> {
    auto t = file->Find(name);
    if (!t.ok()) return t.status();
    auto values = (*t)->ToFloat32(name);
    if (!values.ok()) return values.status();
    return attnserve::MakeTensor(v1::DTYPE_FLOAT32, (*t)->shape, *values);
  };
  v1::MultiHeadAttentionRequest request;
  request.set_module("seed");
  auto query = tensor("input.query");
  if (!query.ok()) return Fail(query.status());
  *request.mutable_query() = *query;
  for (const char* name : {"input.key", "input.value"}) {
    auto t = tensor(name);
    if (!t.ok()) return Fail(t.status());
    *(std::string(name) == "input.key" ? request.mutable_key() : request.mutable_value()) = *t;
  }
  if (auto m = file->Find("input.mask"); m.ok()) {
    auto values = (*m)->ToFloat32("input.mask");
    if (!values.ok()) return Fail(values.status());
    std::vector<uint8_t> mask(values->begin(), values->end());
    *request.mutable_options()->mutable_mask() = attnserve::MakeMask((*m)->shape, mask);
  }
  request.mutable_options()->set_return_weights(true);
  auto response = client.MultiHeadAttention(request, timeout);
  if (!response.ok()) return Fail(response.status());

  auto expected = [&](const char* name) -> std::vector<float> {
    auto t = file->Find(name);
    if (!t.ok()) return {};
    auto values = (*t)->ToFloat32(name);
    return values.ok() ? *values : std::vector<float>{};
  };
  const double out_err =
      MaxAbsDiff(attnserve::TensorToFloats(response->output()).value_or(std::vector<float>{}),
                 expected("expected.output"));
  const double w_err =
      MaxAbsDiff(attnserve::TensorToFloats(response->weights()).value_or(std::vector<float>{}),
                 expected("expected.weights"));
  PrintTensor("output", response->output());
  PrintTiming(response->timing());
  const double tol = absl::GetFlag(FLAGS_tolerance);
  std::printf("seed %s: max |output - expected| = %.3g, max |weights - expected| = %.3g (%s)\n",
              path.c_str(), out_err, w_err, out_err <= tol && w_err <= tol ? "PASS" : "FAIL");
  return out_err <= tol && w_err <= tol ? 0 : 1;
}

absl::StatusOr<std::vector<int64_t>> ParseInts(const std::string& flag, const std::string& value,
                                               size_t count) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    int64_t d;
    if (!absl::SimpleAtoi(part, &d) || d < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", part, "' is not a positive number"));
    }
    out.push_back(d);
  }
  if (out.size() != count) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " needs ", count, " numbers; got '", value, "'"));
  }
  return out;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * v.size())) - 1);
  return v[i];
}

int RunSession(attnserve::Client& client, absl::Duration timeout) {
  namespace k = attnserve::model;
  auto dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return Fail(dtype.status());
  attnserve::SessionOptions options;
  options.cache_dtype = *dtype;
  options.timeout = timeout;
  if (const std::string c = absl::GetFlag(FLAGS_cache_dtype); !c.empty()) {
    auto cache = ParseDType(c);
    if (!cache.ok()) return Fail(cache.status());
    options.cache_dtype = *cache;
  }
  auto kinds = ParseKinds();
  if (!kinds.ok()) return Fail(kinds.status());
  if (kinds->window.has_value()) {
    if (kinds->window->second != 0) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--window: a session is causal; give LEFT,0 (got right ", kinds->window->second, ")")));
    }
    options.window_left = kinds->window->first;
  }
  options.softcap = kinds->softcap;
  options.alibi_standard = kinds->alibi;
  options.kind = kinds->kind;
  options.feature_map = kinds->feature_map;
  const std::string layout_flag = absl::GetFlag(FLAGS_layout);
  int64_t hq = 0, hkv = 0, d = 0, d_model = 0;
  absl::StatusOr<attnserve::Session> session = absl::UnknownError("unset");
  if (!layout_flag.empty()) {
    auto l = ParseInts("layout", layout_flag, 3);
    if (!l.ok()) return Fail(l.status());
    hq = (*l)[0], hkv = (*l)[1], d = (*l)[2];
    attnserve::HeadLayout layout;
    layout.num_heads = static_cast<int>(hq);
    layout.num_kv_heads = static_cast<int>(hkv);
    layout.head_dim = static_cast<int>(d);
    session = attnserve::Session::CreateRaw(&client, layout, options);
  } else {
    auto modules = client.ListModules(timeout);
    if (!modules.ok()) return Fail(modules.status());
    for (const auto& m : modules->modules()) {
      if (m.name() == absl::GetFlag(FLAGS_module)) d_model = m.d_model();
    }
    if (d_model == 0) {
      return Fail(absl::NotFoundError(
          absl::StrCat("no module '", absl::GetFlag(FLAGS_module), "' on the server")));
    }
    session = attnserve::Session::CreateForModule(&client, absl::GetFlag(FLAGS_module), options);
  }
  if (!session.ok()) return Fail(session.status());
  std::printf("session %s\n", session->id().c_str());

  std::mt19937 rng(1);
  // One extend of `n` random tokens (or the file's tensors when `file` is set).
  auto request = [&](int64_t n) {
    v1::ExtendSessionRequest r;
    if (d_model > 0) {
      *r.mutable_input() = attnserve::MakeTensor(*dtype, {n, d_model}, Random(n * d_model, &rng));
    } else {
      *r.mutable_query() = attnserve::MakeTensor(*dtype, {n, hq, d}, Random(n * hq * d, &rng));
      *r.mutable_key() = attnserve::MakeTensor(*dtype, {n, hkv, d}, Random(n * hkv * d, &rng));
      *r.mutable_value() = attnserve::MakeTensor(*dtype, {n, hkv, d}, Random(n * hkv * d, &rng));
    }
    return r;
  };
  v1::ExtendSessionRequest prefill;
  if (const std::string path = absl::GetFlag(FLAGS_file); !path.empty()) {
    auto bytes = attnserve::ReadFileToString(path);
    if (!bytes.ok()) return Fail(bytes.status());
    auto file = k::ParseSafetensors(*bytes);
    if (!file.ok()) return Fail(file.status());
    const std::vector<std::pair<const char*, v1::Tensor*>> wanted =
        d_model > 0
            ? std::vector<std::pair<const char*, v1::Tensor*>>{{"input", prefill.mutable_input()}}
            : std::vector<std::pair<const char*, v1::Tensor*>>{{"query", prefill.mutable_query()},
                                                               {"key", prefill.mutable_key()},
                                                               {"value", prefill.mutable_value()}};
    for (const auto& [name, tensor] : wanted) {
      auto t = file->Find(name);
      if (!t.ok()) return Fail(t.status());
      auto values = (*t)->ToFloat32(name);
      if (!values.ok()) return Fail(values.status());
      *tensor = attnserve::MakeTensor(*dtype, (*t)->shape, *values);
    }
  } else {
    prefill = request(absl::GetFlag(FLAGS_prefill));
  }
  const absl::Time start = absl::Now();
  auto r = session->Extend(prefill);
  if (!r.ok()) return Fail(r.status());
  std::printf("prefill: %lld tokens in %.0f us (server %lld us)\n",
              static_cast<long long>(r->length()), absl::ToDoubleMicroseconds(absl::Now() - start),
              static_cast<long long>(r->timing().server_us()));
  std::vector<double> latencies;
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const absl::Time decode_start = absl::Now();
  for (int64_t i = 0; i < steps; ++i) {
    v1::ExtendSessionRequest step = request(1);
    const absl::Time t0 = absl::Now();
    r = session->Extend(std::move(step));
    const double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
    if (!r.ok()) return Fail(r.status());
    latencies.push_back(us);
    std::printf("step %lld: length %lld, %.0f us (server %lld us, batch of %d)\n",
                static_cast<long long>(i), static_cast<long long>(r->length()), us,
                static_cast<long long>(r->timing().server_us()), r->timing().batch_size());
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - decode_start);
  if (steps > 0) {
    PrintTensor("output", r->output());
    std::printf("decode: %lld steps, p50 %.0f us, p99 %.0f us, %.1f tokens/s\n",
                static_cast<long long>(steps), Percentile(latencies, 0.50),
                Percentile(latencies, 0.99), seconds > 0 ? steps / seconds : 0.0);
  }
  absl::Status closed = session->Close();
  if (!closed.ok()) return Fail(closed);
  std::printf("closed %s\n", session->id().c_str());
  return 0;
}

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  auto bytes = attnserve::ReadFileToString(path);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", bytes.status().message()));
  }
  return *bytes;
}

// ClientOptions from the security flags.
absl::StatusOr<attnserve::ClientOptions> SecurityOptions() {
  attnserve::ClientOptions options;
  const std::string ca = absl::GetFlag(FLAGS_tls_ca_file);
  const std::string cert = absl::GetFlag(FLAGS_tls_cert_file);
  const std::string key = absl::GetFlag(FLAGS_tls_key_file);
  options.tls = absl::GetFlag(FLAGS_tls) || !ca.empty() || !cert.empty();
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("--tls_cert_file and --tls_key_file go together");
  }
  if (!ca.empty()) {
    auto pem = ReadFile("tls_ca_file", ca);
    if (!pem.ok()) return pem.status();
    options.tls_root_certs = *pem;
  }
  if (!cert.empty()) {
    auto pem = ReadFile("tls_cert_file", cert);
    if (!pem.ok()) return pem.status();
    options.tls_client_cert = *pem;
    pem = ReadFile("tls_key_file", key);
    if (!pem.ok()) return pem.status();
    options.tls_client_key = *pem;
  }
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  if (const std::string path = absl::GetFlag(FLAGS_auth_token_file); !path.empty()) {
    auto token = ReadFile("auth_token_file", path);
    if (!token.ok()) return token.status();
    options.auth_token = std::string(absl::StripAsciiWhitespace(*token));
    if (options.auth_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--auth_token_file: ", path, " is empty"));
    }
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  attnserve::ShowFlagsOfFileInHelp(__FILE__);  // --help lists the flags above
  absl::SetProgramUsageMessage(
      "attnserve-cli [--target=HOST:PORT] info|modules|attend|mha|seed|session [flags]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: attnserve-cli [flags] info|modules|attend|mha|seed|session\n");
    return 2;
  }
  auto options = SecurityOptions();
  if (!options.ok()) return Fail(options.status());
  auto client = attnserve::Client::Create(absl::GetFlag(FLAGS_target), *options);
  if (!client.ok()) return Fail(client.status());
  const absl::Duration timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  const std::string command = args[1];
  if (command == "info") {
    auto info = (*client)->GetServerInfo(timeout);
    if (!info.ok()) return Fail(info.status());
    std::printf("%s", info->DebugString().c_str());
    return 0;
  }
  if (command == "modules") {
    auto modules = (*client)->ListModules(timeout);
    if (!modules.ok()) return Fail(modules.status());
    std::printf("%s", modules->DebugString().c_str());
    return 0;
  }
  if (command == "attend") return Attend(**client, timeout);
  if (command == "mha") return MultiHead(**client, timeout);
  if (command == "seed") return Seed(**client, timeout);
  if (command == "session") return RunSession(**client, timeout);
  std::fprintf(stderr, "unknown command '%s'\n", command.c_str());
  return 2;
}
