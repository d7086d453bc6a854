// The fixture of the decode-session tests (session_test.cc, session_mobility_test.cc): a real
// server on a gated backend, a stub, and helpers that build sessions' requests and the causal
// Attend their outputs must equal.
#ifndef ATTNSERVE_TESTS_SERVER_SESSION_FIXTURE_H_
#define ATTNSERVE_TESTS_SERVER_SESSION_FIXTURE_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attnserve/v1/attention.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/reference.h"
#include "server/server_host.h"
#include "tests/testing/exposition.h"
#include "tests/testing/gated_backend.h"

namespace attnserve::session_testing {

inline std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline v1::Tensor F32(const std::vector<float>& values, std::vector<int64_t> shape) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(values.data(), values.size() * sizeof(float));
  return t;
}

inline std::vector<float> Floats(const v1::Tensor& t) {
  std::vector<float> v(t.data().size() / sizeof(float));
  std::memcpy(v.data(), t.data().data(), t.data().size());
  return v;
}

// Rows [from, to) of a token-major [T, ...] array of `row` elements per token.
inline std::vector<float> Rows(const std::vector<float>& a, int64_t row, int64_t from, int64_t to) {
  return std::vector<float>(a.begin() + from * row, a.begin() + to * row);
}

inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return m;
}

// A raw sequence: T tokens of q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv].
struct Sequence {
  int hq, hkv, d, dv;
  int64_t t;
  std::vector<float> q, k, v;
  Sequence(int hq_, int hkv_, int d_, int dv_, int64_t t_, uint32_t seed)
      : hq(hq_), hkv(hkv_), d(d_), dv(dv_), t(t_) {
    q = Random(t * hq * d, seed);
    k = Random(t * hkv * d, seed + 1);
    v = Random(t * hkv * dv, seed + 2);
  }
  v1::ExtendSessionRequest Extend(const std::string& id, int64_t from, int64_t to) const {
    v1::ExtendSessionRequest r;
    r.set_session_id(id);
    *r.mutable_query() = F32(Rows(q, hq * d, from, to), {to - from, hq, d});
    *r.mutable_key() = F32(Rows(k, hkv * d, from, to), {to - from, hkv, d});
    *r.mutable_value() = F32(Rows(v, hkv * dv, from, to), {to - from, hkv, dv});
    return r;
  }
};

// [T, H, X] -> [1, H, T, X]
inline std::vector<float> HeadMajor(const std::vector<float>& a, int64_t t, int h, int x) {
  std::vector<float> out(a.size());
  for (int64_t i = 0; i < t; ++i) {
    for (int j = 0; j < h; ++j) {
      for (int c = 0; c < x; ++c) out[(j * t + i) * x + c] = a[(i * h + j) * x + c];
    }
  }
  return out;
}

// A CreateSessionRequest of a raw head layout (dv 0: D) with a cache of `cache`'s type.
inline v1::CreateSessionRequest RawLayout(int hq, int hkv, int d, int dv,
                                          v1::Dtype cache = v1::DTYPE_FLOAT32) {
  v1::CreateSessionRequest r;
  r.mutable_layout()->set_num_heads(hq);
  r.mutable_layout()->set_num_kv_heads(hkv);
  r.mutable_layout()->set_head_dim(d);
  r.mutable_layout()->set_v_head_dim(dv);
  r.set_cache_dtype(cache);
  return r;
}

class SessionTest : public ::testing::Test {
 public:
  void Start(
      server::ServerOptions options = {},
      std::unique_ptr<kernels::Backend> inner = std::make_unique<kernels::ReferenceBackend>()) {
    options.listen_address = "127.0.0.1:0";
    auto backend = std::make_unique<testing::GatedBackend>(std::move(inner));
    gate_ = backend.get();
    metrics_ = metrics::Metrics::Create({}).value();
    auto host = server::ServerHost::Start(options, std::move(backend), metrics_.get());
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = *std::move(host);
    stub_ = v1::AttentionService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(host_->port()), grpc::InsecureChannelCredentials()));
  }
  // A fresh server (the previous one stopped) on the reference backend, or on the CPU backend
  // at this CPU's instruction set.
  void Restart(server::ServerOptions options, bool cpu) {
    if (host_ != nullptr) TearDown();
    if (!cpu) return Start(options);
    auto backend = kernels::cpu::CpuBackend::Create({});
    ASSERT_TRUE(backend.ok()) << backend.status();
    Start(options, *std::move(backend));
  }
  void TearDown() override {
    if (gate_ != nullptr) gate_->Open();
    host_.reset();
    gate_ = nullptr;
  }

  // The new session's state (a failure is a test failure).
  v1::SessionInfo Create(const v1::CreateSessionRequest& r) {
    v1::CreateSessionResponse response;
    grpc::ClientContext context;
    const grpc::Status s = stub_->CreateSession(&context, r, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.session();
  }
  std::string CreateRaw(int hq, int hkv, int d, int dv, bool pinned = false) {
    v1::CreateSessionRequest r = RawLayout(hq, hkv, d, dv);
    r.set_pinned(pinned);
    return Create(r).session_id();
  }
  grpc::Status LoadModule(const std::string& name, const std::string& safetensors) {
    v1::LoadModuleRequest r;
    r.set_name(name);
    r.set_safetensors(safetensors);
    v1::LoadModuleResponse response;
    grpc::ClientContext context;
    return stub_->LoadModule(&context, r, &response);
  }
  // Extends module session `id` with the t inputs [t, d]: the first half as one prefill, then
  // one token at a time; returns the outputs in order.
  std::vector<float> PrefillHalfThenSteps(const std::string& id, const std::vector<float>& input,
                                          int64_t d, int64_t t) {
    std::vector<float> got;
    for (int64_t from = 0; from < t;) {
      const int64_t to = from == 0 ? t / 2 : from + 1;
      v1::ExtendSessionRequest r;
      r.set_session_id(id);
      *r.mutable_input() = F32(Rows(input, d, from, to), {to - from, d});
      v1::ExtendSessionResponse response;
      const grpc::Status st = Extend(r, &response);
      EXPECT_TRUE(st.ok()) << st.error_message();
      const std::vector<float> out = Floats(response.output());
      got.insert(got.end(), out.begin(), out.end());
      from = to;
    }
    return got;
  }
  grpc::Status Extend(const v1::ExtendSessionRequest& r, v1::ExtendSessionResponse* response,
                      std::string* lost = nullptr) {
    grpc::ClientContext context;
    const grpc::Status s = stub_->ExtendSession(&context, r, response);
    if (lost != nullptr) {
      auto it = context.GetServerTrailingMetadata().find("attnserve-session-lost");
      *lost = it == context.GetServerTrailingMetadata().end()
                  ? ""
                  : std::string(it->second.data(), it->second.size());
    }
    return s;
  }
  grpc::Status Get(const std::string& id, v1::SessionInfo* info = nullptr) {
    v1::GetSessionRequest r;
    r.set_session_id(id);
    v1::GetSessionResponse response;
    grpc::ClientContext context;
    const grpc::Status s = stub_->GetSession(&context, r, &response);
    if (info != nullptr) *info = response.session();
    return s;
  }
  grpc::Status Close(const std::string& id) {
    v1::CloseSessionRequest r;
    r.set_session_id(id);
    v1::CloseSessionResponse response;
    grpc::ClientContext context;
    return stub_->CloseSession(&context, r, &response);
  }
  std::string Fork(const std::string& id) {
    v1::ForkSessionRequest r;
    r.set_session_id(id);
    v1::ForkSessionResponse response;
    grpc::ClientContext context;
    const grpc::Status s = stub_->ForkSession(&context, r, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.session().session_id();
  }
  v1::SessionPoolUsage Usage() {
    v1::ListSessionsResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->ListSessions(&context, {}, &response).ok());
    return response.usage();
  }
  // The causal Attend of tokens [0, t) of `s` (with `options`, causal set), token-major
  // [t, Hq, Dv].
  std::vector<float> CausalAttend(const Sequence& s, int64_t t,
                                  const v1::AttentionOptions& options = {}) {
    return CausalAttendRows(s, 0, t, options);
  }
  // Rows [from, t) of CausalAttend(s, t, options): those queries alone over keys [0, t), which
  // Attend's causality aligns bottom-right (query i of t - from sees keys j <= from + i), so a
  // test that needs the last rows of a long sequence does not compute all of them.
  std::vector<float> CausalAttendRows(const Sequence& s, int64_t from, int64_t t,
                                      const v1::AttentionOptions& options = {}) {
    const int64_t n = t - from;
    v1::AttendRequest r;
    *r.mutable_options() = options;
    *r.mutable_query() =
        F32(HeadMajor(Rows(s.q, s.hq * s.d, from, t), n, s.hq, s.d), {1, s.hq, n, s.d});
    *r.mutable_key() =
        F32(HeadMajor(Rows(s.k, s.hkv * s.d, 0, t), t, s.hkv, s.d), {1, s.hkv, t, s.d});
    *r.mutable_value() =
        F32(HeadMajor(Rows(s.v, s.hkv * s.dv, 0, t), t, s.hkv, s.dv), {1, s.hkv, t, s.dv});
    r.mutable_options()->set_causal(true);
    v1::AttendResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->Attend(&context, r, &response).ok());
    // [1, Hq, n, Dv] -> [n, Hq, Dv]
    const std::vector<float> o = Floats(response.output());
    std::vector<float> out(o.size());
    for (int64_t i = 0; i < n; ++i) {
      for (int h = 0; h < s.hq; ++h) {
        for (int c = 0; c < s.dv; ++c) out[(i * s.hq + h) * s.dv + c] = o[(h * n + i) * s.dv + c];
      }
    }
    return out;
  }
  // Extends session `id` with tokens [from, to) of `s` and returns the output.
  std::vector<float> Step(const std::string& id, const Sequence& s, int64_t from, int64_t to) {
    v1::ExtendSessionResponse response;
    const grpc::Status st = Extend(s.Extend(id, from, to), &response);
    EXPECT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(response.length(), to);
    return Floats(response.output());
  }
  double Metric(const std::string& family, const std::vector<std::string>& labels) {
    return testing::MetricSample(metrics_->ExpositionText(), family, labels);
  }

  testing::GatedBackend* gate_ = nullptr;
  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<server::ServerHost> host_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

// Pages of 4 tokens, prefills computed 3 new tokens a batch.
inline server::ServerOptions SmallPages() {
  server::ServerOptions options;
  options.sessions.page_tokens = 4;
  options.sessions.prefill_chunk_tokens = 3;
  return options;
}

}  // namespace attnserve::session_testing

#endif  // ATTNSERVE_TESTS_SERVER_SESSION_FIXTURE_H_
