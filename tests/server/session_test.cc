// Decode sessions end to end through a real server and client (server/sessions/, the session
// rpcs): outputs equal one causal Attend / MultiHeadAttention over the whole sequence after any
// sequence of prefills and steps; forks; every documented code (lost: evicted, expired,
// restarted; pool full; bad ids; ABORTED); no page leaks; batch invariance, bitwise. A gated
// backend and a fake clock make every ordering deterministic; no test depends on a timing window.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/reference.h"
#include "server/batching/fake_clock.h"
#include "server/server_host.h"
#include "server/sessions/session_manager.h"
#include "tests/server/session_fixture.h"
#include "tests/testing/exposition.h"
#include "tests/testing/gated_backend.h"
#include "tests/testing/losable_store.h"
#include "tests/testing/seed_vectors.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;
using namespace session_testing;  // NOLINT: the fixture and its helpers

TEST_F(SessionTest, RawSessionAfterPrefillsAndStepsEqualsOneCausalAttend) {
  Start(SmallPages());
  const Sequence s(4, 2, 8, 6, 23, 7);
  const std::string id = CreateRaw(4, 2, 8, 6);
  std::vector<float> got;
  // Prefills and steps across page boundaries (4 tokens a page).
  const std::vector<int64_t> cuts = {0, 7, 8, 9, 10, 15, 16, 17, 21, 22, 23};
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const std::vector<float> out = Step(id, s, cuts[i], cuts[i + 1]);
    got.insert(got.end(), out.begin(), out.end());
  }
  EXPECT_LE(MaxAbsDiff(got, CausalAttend(s, s.t)), 1e-6);
  EXPECT_EQ(Metric("attnserve_session_tokens_appended_total", {"phase=\"decode\""}), 7);
  EXPECT_EQ(Metric("attnserve_session_tokens_appended_total", {"phase=\"prefill\""}), 16);
  v1::SessionInfo info;
  ASSERT_TRUE(Get(id, &info).ok());
  EXPECT_EQ(info.length(), 23);
  EXPECT_EQ(info.pages(), 6);
  EXPECT_EQ(info.layout().v_head_dim(), 6);
}

// The score modifications of a session (a window, soft-cap, ALiBi) in CreateSessionRequest and
// in AttentionOptions alike.
struct Mods {
  int window_left;
  float softcap;
  std::vector<float> slopes;
  void To(v1::CreateSessionRequest* r) const {
    r->mutable_window()->set_left(window_left);
    r->set_softcap(softcap);
    for (float slope : slopes) r->mutable_alibi()->add_slopes(slope);
  }
  void To(v1::AttentionOptions* o) const {
    o->mutable_window()->set_left(window_left);
    o->mutable_window()->set_right(0);
    o->set_softcap(softcap);
    for (float slope : slopes) o->mutable_alibi()->add_slopes(slope);
  }
};

// A session with a sliding window, soft-capping and ALiBi computes what a causal Attend with the
// same options computes, through prefills and steps across pages (and windows starting inside
// pages and splits), on the reference and the CPU backends; GetSession reports them and a fork
// keeps them.
TEST_F(SessionTest, ScoreModsSessionsEqualAttendWithTheSameOptions) {
  const Mods mods{.window_left = 5, .softcap = 1.5f, .slopes = {0.5f, 0.25f, 0.125f, 0.0625f}};
  for (const bool cpu : {false, true}) {
    Restart(SmallPages(), cpu);
    const Sequence s(4, 2, 8, 6, 23, 11);
    v1::CreateSessionRequest create;
    create.mutable_layout()->set_num_heads(4);
    create.mutable_layout()->set_num_kv_heads(2);
    create.mutable_layout()->set_head_dim(8);
    create.mutable_layout()->set_v_head_dim(6);
    create.set_cache_dtype(v1::DTYPE_FLOAT32);
    mods.To(&create);
    const v1::SessionInfo created = Create(create);
    const std::string id = created.session_id();
    EXPECT_EQ(created.window_left(), 5);
    EXPECT_EQ(created.softcap(), 1.5f);
    EXPECT_EQ(created.alibi_slopes_size(), 4);
    std::vector<float> got;
    const std::vector<int64_t> cuts = {0, 7, 8, 9, 15, 16, 17, 20};
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const std::vector<float> out = Step(id, s, cuts[i], cuts[i + 1]);
      got.insert(got.end(), out.begin(), out.end());
    }
    // The fork continues as the parent would (both hold the same tokens and options).
    const std::string fork = Fork(id);
    const std::vector<float> parent_tail = Step(id, s, 20, 23);
    const std::vector<float> fork_tail = Step(fork, s, 20, 23);
    EXPECT_EQ(parent_tail, fork_tail) << (cpu ? "cpu" : "reference");
    got.insert(got.end(), parent_tail.begin(), parent_tail.end());
    v1::AttentionOptions options;
    mods.To(&options);
    const std::vector<float> want = CausalAttend(s, s.t, options);
    EXPECT_LE(MaxAbsDiff(got, want), 2e-6) << (cpu ? "cpu" : "reference");
    // Without the modifications the answer is far from it: the case tests them.
    EXPECT_GT(MaxAbsDiff(got, CausalAttend(s, s.t)), 1e-2);
  }
}

// A windowed session gives back the pages that have left its window (all but the 256-key split
// holding the window's start and those after it), and still answers as Attend does; so does a
// fork taken after pages were dropped. Pages of 4 tokens, a window of 40 keys.
TEST_F(SessionTest, AWindowedSessionFreesThePagesBeforeItsWindow) {
  for (const bool cpu : {false, true}) {
    Restart(SmallPages(), cpu);
    const Mods mods{.window_left = 40, .softcap = 0.0f, .slopes = {}};
    const Sequence s(2, 1, 8, 8, 700, 21);
    v1::CreateSessionRequest create;
    create.mutable_layout()->set_num_heads(2);
    create.mutable_layout()->set_num_kv_heads(1);
    create.mutable_layout()->set_head_dim(8);
    create.set_cache_dtype(v1::DTYPE_FLOAT32);
    mods.To(&create);
    const std::string id = Create(create).session_id();
    std::vector<float> got;
    for (const auto& [from, to] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 300}, {300, 301}, {301, 600}, {600, 601}, {601, 650}}) {
      const std::vector<float> out = Step(id, s, from, to);
      got.insert(got.end(), out.begin(), out.end());
    }
    // At 650 tokens the next token attends from 610 on: the split of keys [512, 768) onwards
    // stays, pages 128.. of 163 (pages of 4 tokens); 128 went back to the pool.
    v1::SessionInfo info;
    ASSERT_TRUE(Get(id, &info).ok());
    EXPECT_EQ(info.length(), 650);
    EXPECT_EQ(info.pages(), 163 - 128);
    EXPECT_EQ(Usage().pages_used(), 163 - 128);
    const std::string fork = Fork(id);
    const std::vector<float> tail = Step(id, s, 650, 700);
    EXPECT_EQ(Step(fork, s, 650, 700), tail) << (cpu ? "cpu" : "reference");
    got.insert(got.end(), tail.begin(), tail.end());
    v1::AttentionOptions options;
    mods.To(&options);
    EXPECT_LE(MaxAbsDiff(got, CausalAttend(s, s.t, options)), 2e-6) << (cpu ? "cpu" : "reference");
    ASSERT_TRUE(Close(id).ok());
    ASSERT_TRUE(Close(fork).ok());
    EXPECT_EQ(Usage().pages_used(), 0);
  }
}

// A module session with a window and ALiBi (the standard slopes of its heads) answers as
// MultiHeadAttention with the same options does.
TEST_F(SessionTest, ModuleSessionsTakeScoreModsAsMultiHeadAttentionDoes) {
  for (const bool cpu : {false, true}) {
    ASSERT_NO_FATAL_FAILURE(Restart(SmallPages(), cpu));
    SCOPED_TRACE(cpu ? "cpu" : "reference");
    auto c = testing::LoadSeedCase("seed_demo");
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(LoadModule("demo_mods", c->bytes).ok());
    const int64_t d = c->weights.d_model, t = c->q_len;
    const std::vector<float> input(c->query.begin(), c->query.begin() + t * d);
    v1::CreateSessionRequest create;
    create.set_module("demo_mods");
    create.set_cache_dtype(v1::DTYPE_FLOAT32);
    create.mutable_window()->set_left(3);
    create.mutable_alibi()->set_standard(true);
    const v1::SessionInfo created = Create(create);
    EXPECT_EQ(created.alibi_slopes_size(), c->weights.num_heads);
    const std::vector<float> got = PrefillHalfThenSteps(created.session_id(), input, d, t);
    v1::MultiHeadAttentionRequest mha;
    mha.set_module("demo_mods");
    *mha.mutable_query() = F32(input, {1, t, d});
    mha.mutable_options()->set_causal(true);
    mha.mutable_options()->mutable_window()->set_left(3);
    mha.mutable_options()->mutable_window()->set_right(0);
    mha.mutable_options()->mutable_alibi()->set_standard(true);
    v1::MultiHeadAttentionResponse expected;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->MultiHeadAttention(&context, mha, &expected).ok());
    EXPECT_LE(MaxAbsDiff(got, Floats(expected.output())), 1e-4);
    mha.mutable_options()->clear_window();
    mha.mutable_options()->clear_alibi();
    v1::MultiHeadAttentionResponse plain;
    grpc::ClientContext plain_context;
    ASSERT_TRUE(stub_->MultiHeadAttention(&plain_context, mha, &plain).ok());
    EXPECT_GT(MaxAbsDiff(got, Floats(plain.output())), 1e-3);  // the options matter here
  }
}

// A backend whose paged attention takes no score modifications (as the CUDA backend's did).
class NoSessionModsBackend final : public kernels::Backend {
 public:
  std::string name() const override { return "no-session-mods"; }
  std::vector<kernels::DeviceInfo> devices() const override { return inner_.devices(); }
  bool supports_session_score_mods() const override { return false; }
  absl::Status Attend(absl::Span<const kernels::AttentionParams> batch) override {
    return inner_.Attend(batch);
  }
  absl::Status MultiHead(absl::Span<const kernels::MultiHeadParams> batch) override {
    return inner_.MultiHead(batch);
  }

 private:
  kernels::ReferenceBackend inner_;
};

TEST_F(SessionTest, ScoreModsAreCheckedAndRefusedWhereTheBackendLacksThem) {
  Start(SmallPages());
  const auto create = [&](const std::function<void(v1::CreateSessionRequest*)>& edit) {
    v1::CreateSessionRequest r;
    r.mutable_layout()->set_num_heads(4);
    r.mutable_layout()->set_num_kv_heads(2);
    r.mutable_layout()->set_head_dim(8);
    r.set_cache_dtype(v1::DTYPE_FLOAT32);
    edit(&r);
    v1::CreateSessionResponse response;
    grpc::ClientContext context;
    return stub_->CreateSession(&context, r, &response);
  };
  const struct {
    std::function<void(v1::CreateSessionRequest*)> edit;
    std::string message;
  } bad[] = {
      {[](auto* r) { r->mutable_window()->set_left(-1); }, "window.left must be >= 0"},
      {[](auto* r) { r->mutable_window()->set_right(3); }, "window.right must be 0 or -1"},
      {[](auto* r) { r->set_softcap(-1.0f); }, "softcap must be finite and >= 0; was -1"},
      {[](auto* r) { r->mutable_alibi()->add_slopes(0.5f); },
       "alibi.slopes must hold H (4) entries; had 1"},
      {[](auto* r) { r->mutable_alibi(); }, "alibi must hold either slopes"},
  };
  for (const auto& b : bad) {
    const grpc::Status st = create(b.edit);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << b.message;
    EXPECT_THAT(st.error_message(), ::testing::HasSubstr(b.message));
  }
  EXPECT_TRUE(create([](auto* r) { r->mutable_alibi()->set_standard(true); }).ok());

  TearDown();
  Start(SmallPages(), std::make_unique<NoSessionModsBackend>());
  const grpc::Status refused = create([](auto* r) { r->set_softcap(2.0f); });
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("softcap"));
  EXPECT_TRUE(create([](auto*) {}).ok());  // plain sessions are still served
}

v1::Tensor Encode(const v1::Tensor& f32, v1::Dtype dtype) {
  const std::vector<float> values = Floats(f32);
  const kernels::DType t =
      dtype == v1::DTYPE_FLOAT16 ? kernels::DType::kFloat16 : kernels::DType::kBFloat16;
  v1::Tensor out = f32;
  out.set_dtype(dtype);
  std::string data(values.size() * 2, '\0');
  kernels::FromFloat32(t, values.data(), values.size(), data.data());
  out.set_data(data);
  return out;
}

std::vector<float> Decode(const v1::Tensor& t) {
  const kernels::DType type =
      t.dtype() == v1::DTYPE_FLOAT16 ? kernels::DType::kFloat16 : kernels::DType::kBFloat16;
  std::vector<float> v(t.data().size() / 2);
  kernels::ToFloat32(type, t.data().data(), v.size(), v.data());
  return v;
}

// A linear-attention session (CreateSessionRequest.kind) computes, bit for bit, what a causal
// linear Attend over all its tokens computes on the CPU backend, for each feature map, through
// prefills and steps, with the Attend's keys and values rounded to the cache's type (queries as
// sent). Its state takes ceil(D / page_tokens) pages however long it grows.
TEST_F(SessionTest, LinearSessionsEqualACausalLinearAttendBitForBit) {
  ASSERT_NO_FATAL_FAILURE(Restart(SmallPages(), /*cpu=*/true));  // D = 8: 2 pages of 4 tokens
  for (const v1::FeatureMap map :
       {v1::FEATURE_MAP_UNSPECIFIED, v1::FEATURE_MAP_RELU, v1::FEATURE_MAP_IDENTITY}) {
    for (const v1::Dtype cache : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
      SCOPED_TRACE(v1::FeatureMap_Name(map) + " " + v1::Dtype_Name(cache));
      const Sequence s(4, 2, 8, 6, 23, 31);
      v1::CreateSessionRequest create = RawLayout(4, 2, 8, 6, cache);
      create.set_kind(v1::ATTENTION_KIND_LINEAR);
      create.set_feature_map(map);
      const v1::SessionInfo created = Create(create);
      EXPECT_EQ(created.kind(), v1::ATTENTION_KIND_LINEAR);
      EXPECT_EQ(created.feature_map(),
                map == v1::FEATURE_MAP_UNSPECIFIED ? v1::FEATURE_MAP_ELU_PLUS_ONE : map);
      EXPECT_EQ(created.cache_dtype(), cache);
      std::vector<float> got;
      const std::vector<int64_t> cuts = {0, 7, 8, 9, 17, 18, 23};
      for (size_t i = 0; i + 1 < cuts.size(); ++i) {
        const std::vector<float> out = Step(created.session_id(), s, cuts[i], cuts[i + 1]);
        got.insert(got.end(), out.begin(), out.end());
        v1::SessionInfo info;
        ASSERT_TRUE(Get(created.session_id(), &info).ok());
        EXPECT_EQ(info.pages(), 2) << "after " << cuts[i + 1] << " tokens";
        EXPECT_EQ(info.bytes(), 2 * (2 * 4 * (8 + 6) * 4)) << "two float32 pages";
      }
      Sequence rounded = s;
      if (cache != v1::DTYPE_FLOAT32) {
        rounded.k = Decode(Encode(F32(s.k, {int64_t(s.k.size())}), cache));
        rounded.v = Decode(Encode(F32(s.v, {int64_t(s.v.size())}), cache));
      }
      v1::AttentionOptions linear;
      linear.set_kind(v1::ATTENTION_KIND_LINEAR);
      linear.set_feature_map(map);
      EXPECT_EQ(got, CausalAttend(rounded, s.t, linear));
      if (cache != v1::DTYPE_FLOAT32) {
        EXPECT_NE(got, CausalAttend(s, s.t, linear)) << "the keys and values were rounded";
      }
      ASSERT_TRUE(Close(created.session_id()).ok());
    }
  }
  EXPECT_EQ(Usage().pages_used(), 0);
}

// A fork shares its parent's state (its pages) until either is extended; then each continues
// as a linear Attend over its own tokens, the parent untouched by the fork's extends.
TEST_F(SessionTest, LinearSessionForksShareTheStateUntilExtended) {
  ASSERT_NO_FATAL_FAILURE(Restart(SmallPages(), /*cpu=*/true));
  const Sequence s(2, 1, 8, 8, 12, 41);
  Sequence other = s;
  const Sequence tail(2, 1, 8, 8, 12, 43);
  for (int64_t i = 6 * 2 * 8; i < int64_t(other.q.size()); ++i) other.q[i] = tail.q[i];
  for (int64_t i = 6 * 8; i < int64_t(other.k.size()); ++i) other.k[i] = tail.k[i];
  for (int64_t i = 6 * 8; i < int64_t(other.v.size()); ++i) other.v[i] = tail.v[i];
  v1::CreateSessionRequest create = RawLayout(2, 1, 8, 0);
  create.set_kind(v1::ATTENTION_KIND_LINEAR);
  const std::string parent = Create(create).session_id();
  std::vector<float> got_parent = Step(parent, s, 0, 6);
  std::vector<float> got_child = got_parent;
  const std::string child = Fork(parent);
  v1::SessionInfo info;
  ASSERT_TRUE(Get(child, &info).ok());
  EXPECT_EQ(info.kind(), v1::ATTENTION_KIND_LINEAR);
  EXPECT_EQ(info.shared_pages(), 2);
  EXPECT_EQ(Usage().pages_used(), 2);
  for (int64_t t = 6; t < 12; ++t) {
    const std::vector<float> c = Step(child, other, t, t + 1);
    got_child.insert(got_child.end(), c.begin(), c.end());
  }
  ASSERT_TRUE(Get(child, &info).ok());
  EXPECT_EQ(info.shared_pages(), 0);
  EXPECT_EQ(Usage().pages_used(), 4);
  const std::vector<float> p = Step(parent, s, 6, 12);
  got_parent.insert(got_parent.end(), p.begin(), p.end());
  v1::AttentionOptions linear;
  linear.set_kind(v1::ATTENTION_KIND_LINEAR);
  EXPECT_EQ(got_parent, CausalAttend(s, 12, linear));
  EXPECT_EQ(got_child, CausalAttend(other, 12, linear));
  EXPECT_NE(got_parent, got_child);
}

// A module session of kind LINEAR computes as MultiHeadAttention with a causal linear kind (its
// projections in other batches: within float32 rounding, not bit for bit).
TEST_F(SessionTest, LinearModuleSessionsEqualLinearMultiHeadAttention) {
  ASSERT_NO_FATAL_FAILURE(Restart(SmallPages(), /*cpu=*/true));
  auto c = testing::LoadSeedCase("seed_demo");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(LoadModule("demo_linear", c->bytes).ok());
  const int64_t d = c->weights.d_model, t = c->q_len;
  const std::vector<float> input(c->query.begin(), c->query.begin() + t * d);
  v1::CreateSessionRequest create;
  create.set_module("demo_linear");
  create.set_cache_dtype(v1::DTYPE_FLOAT32);
  create.set_kind(v1::ATTENTION_KIND_LINEAR);
  const v1::SessionInfo created = Create(create);
  const std::vector<float> got = PrefillHalfThenSteps(created.session_id(), input, d, t);
  v1::MultiHeadAttentionRequest mha;
  mha.set_module("demo_linear");
  *mha.mutable_query() = F32(input, {1, t, d});
  mha.mutable_options()->set_causal(true);
  mha.mutable_options()->set_kind(v1::ATTENTION_KIND_LINEAR);
  v1::MultiHeadAttentionResponse expected;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->MultiHeadAttention(&context, mha, &expected).ok());
  EXPECT_LE(MaxAbsDiff(got, Floats(expected.output())), 1e-5);
  mha.mutable_options()->clear_kind();
  v1::MultiHeadAttentionResponse softmax;
  grpc::ClientContext softmax_context;
  ASSERT_TRUE(stub_->MultiHeadAttention(&softmax_context, mha, &softmax).ok());
  EXPECT_GT(MaxAbsDiff(got, Floats(softmax.output())), 1e-3);  // the kind matters here
}

// What LINEAR does not take is refused naming the field; a linear session's length is not
// bounded by --max_sequence_length (each extend is), a softmax session's is.
TEST_F(SessionTest, LinearSessionsRefuseWhatTheyDoNotTakeAndOutgrowTheSequenceLimit) {
  server::ServerOptions options = SmallPages();
  options.limits.max_sequence_length = 8;
  Start(options);
  const auto create = [&](const std::function<void(v1::CreateSessionRequest*)>& edit,
                          v1::SessionInfo* info = nullptr) {
    v1::CreateSessionRequest r = RawLayout(2, 2, 4, 0);
    r.set_kind(v1::ATTENTION_KIND_LINEAR);
    edit(&r);
    v1::CreateSessionResponse response;
    grpc::ClientContext context;
    const grpc::Status st = stub_->CreateSession(&context, r, &response);
    if (info != nullptr) *info = response.session();
    return st;
  };
  const struct {
    std::function<void(v1::CreateSessionRequest*)> edit;
    std::string message;
  } bad[] = {
      {[](auto* r) { r->mutable_window()->set_left(4); }, "window does not apply to kind"},
      {[](auto* r) { r->set_softcap(2.0f); }, "softcap does not apply to kind"},
      {[](auto* r) { r->mutable_alibi()->set_standard(true); }, "alibi does not apply to kind"},
      {[](auto* r) { r->set_scale(0.5f); }, "scale does not apply to kind"},
      {[](auto* r) { r->set_feature_map(static_cast<v1::FeatureMap>(9)); },
       "feature_map must be one of FEATURE_MAP_ELU_PLUS_ONE, FEATURE_MAP_RELU, "
       "FEATURE_MAP_IDENTITY; was 9"},
      {[](auto* r) { r->set_kind(static_cast<v1::AttentionKind>(7)); },
       "kind must be ATTENTION_KIND_SOFTMAX or ATTENTION_KIND_LINEAR (or unset); was 7"},
      {[](auto* r) {
         r->clear_kind();
         r->set_feature_map(v1::FEATURE_MAP_RELU);
       },
       "feature_map applies to kind ATTENTION_KIND_LINEAR only; was FEATURE_MAP_RELU"},
  };
  for (const auto& b : bad) {
    const grpc::Status st = create(b.edit);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << b.message;
    EXPECT_THAT(st.error_message(), ::testing::HasSubstr(b.message));
  }
  v1::SessionInfo linear, softmax;
  ASSERT_TRUE(create([](auto*) {}, &linear).ok());
  ASSERT_TRUE(create([](auto* r) { r->clear_kind(); }, &softmax).ok());
  EXPECT_EQ(softmax.kind(), v1::ATTENTION_KIND_SOFTMAX);
  const Sequence s(2, 2, 4, 4, 24, 61);
  v1::ExtendSessionRequest with_lse = s.Extend(linear.session_id(), 0, 8);
  with_lse.set_return_lse(true);
  v1::ExtendSessionResponse response;
  const grpc::Status lse = Extend(with_lse, &response);
  EXPECT_EQ(lse.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(lse.error_message(), HasSubstr("return_lse does not apply"));
  for (int64_t from = 0; from < 24; from += 8) {
    ASSERT_TRUE(Extend(s.Extend(linear.session_id(), from, from + 8), &response).ok()) << from;
    EXPECT_EQ(response.length(), from + 8);
  }
  ASSERT_TRUE(Extend(s.Extend(softmax.session_id(), 0, 8), &response).ok());
  EXPECT_EQ(Extend(s.Extend(softmax.session_id(), 8, 16), &response).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(SessionTest, HalfPrecisionCachesEqualAnAttendInTheSameDtype) {
  Start(SmallPages());
  for (const v1::Dtype dtype : {v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    SCOPED_TRACE(v1::Dtype_Name(dtype));
    const Sequence s(4, 2, 8, 8, 11, 51);
    v1::CreateSessionRequest create;
    create.mutable_layout()->set_num_heads(4);
    create.mutable_layout()->set_num_kv_heads(2);
    create.mutable_layout()->set_head_dim(8);
    create.set_cache_dtype(dtype);
    v1::CreateSessionResponse created;
    grpc::ClientContext c1;
    ASSERT_TRUE(stub_->CreateSession(&c1, create, &created).ok());
    EXPECT_EQ(created.session().cache_dtype(), dtype);
    std::vector<float> got;
    for (const auto& [from, to] :
         std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 6}, {6, 11}}) {
      v1::ExtendSessionRequest r = s.Extend(created.session().session_id(), from, to);
      *r.mutable_query() = Encode(r.query(), dtype);
      *r.mutable_key() = Encode(r.key(), dtype);
      *r.mutable_value() = Encode(r.value(), dtype);
      v1::ExtendSessionResponse response;
      ASSERT_TRUE(Extend(r, &response).ok());
      ASSERT_EQ(response.output().dtype(), dtype);
      const std::vector<float> out = Decode(response.output());
      got.insert(got.end(), out.begin(), out.end());
    }
    v1::AttendRequest attend;
    const int64_t t = s.t;
    *attend.mutable_query() = Encode(F32(HeadMajor(s.q, t, 4, 8), {1, 4, t, 8}), dtype);
    *attend.mutable_key() = Encode(F32(HeadMajor(s.k, t, 2, 8), {1, 2, t, 8}), dtype);
    *attend.mutable_value() = Encode(F32(HeadMajor(s.v, t, 2, 8), {1, 2, t, 8}), dtype);
    attend.mutable_options()->set_causal(true);
    v1::AttendResponse expected;
    grpc::ClientContext c2;
    ASSERT_TRUE(stub_->Attend(&c2, attend, &expected).ok());
    const std::vector<float> e = Decode(expected.output());  // [1, 4, t, 8]
    std::vector<float> want(e.size());
    for (int64_t i = 0; i < t; ++i) {
      for (int h = 0; h < 4; ++h) {
        for (int c = 0; c < 8; ++c) want[(i * 4 + h) * 8 + c] = e[(h * t + i) * 8 + c];
      }
    }
    // The same inputs, both computed in float64 and rounded once: within one rounding of the
    // dtype (values are below 1: 2^-8 for bfloat16).
    EXPECT_LE(MaxAbsDiff(got, want), dtype == v1::DTYPE_BFLOAT16 ? 1.0 / 256 : 1e-3);
  }
}

// Only keys and values are rounded to the cache's dtype (the proto's CreateSessionRequest):
// for every cache dtype and every request dtype, prefills and steps (across page and chunk
// boundaries) agree with a float64 causal attention over the queries as sent and K and V
// rounded to the request's and then the cache's type, within float32 arithmetic (2e-5 for
// float32 outputs and every lse) plus, for 16-bit outputs, one rounding of the output. The
// server once rounded the queries to the cache's type too: off by up to 8e-4 (FLOAT16 cache) or
// 4e-3 (BFLOAT16) on float32 queries, far outside these bounds. On the reference backend (the
// server's conversions alone) and the CPU backend (its kernels at this CPU's instruction set;
// D = 40 is not a whole number of the bfloat16 dot product's pairs).
TEST_F(SessionTest, OnlyKeysAndValuesAreRoundedToTheCacheDtype) {
  const v1::Dtype dtypes[] = {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16};
  auto type_of = [](v1::Dtype d) {
    return d == v1::DTYPE_FLOAT32   ? kernels::DType::kFloat32
           : d == v1::DTYPE_FLOAT16 ? kernels::DType::kFloat16
                                    : kernels::DType::kBFloat16;
  };
  // x as a value of type t (rounded to nearest even, as the server rounds).
  auto round_to = [](kernels::DType t, std::vector<float> x) {
    if (t == kernels::DType::kFloat32) return x;
    std::vector<uint16_t> bits(x.size());
    kernels::FromFloat32(t, x.data(), x.size(), bits.data());
    kernels::ToFloat32(t, bits.data(), x.size(), x.data());
    return x;
  };
  auto encode = [&](const v1::Tensor& f32, v1::Dtype d) {
    return d == v1::DTYPE_FLOAT32 ? f32 : Encode(f32, d);
  };
  auto decode = [](const v1::Tensor& t) {
    return t.dtype() == v1::DTYPE_FLOAT32 ? Floats(t) : Decode(t);
  };
  constexpr int kHq = 4, kHkv = 2, kD = 40, kDv = 24;
  const Sequence seq(kHq, kHkv, kD, kDv, 11, 77);
  for (const bool cpu : {false, true}) {
    SCOPED_TRACE(cpu ? "cpu backend" : "reference backend");
    ASSERT_NO_FATAL_FAILURE(Restart(SmallPages(), cpu));
    for (const v1::Dtype cache : dtypes) {
      for (const v1::Dtype wire : dtypes) {
        SCOPED_TRACE(
            absl::StrCat("cache ", v1::Dtype_Name(cache), ", request ", v1::Dtype_Name(wire)));
        v1::CreateSessionRequest create;
        create.mutable_layout()->set_num_heads(kHq);
        create.mutable_layout()->set_num_kv_heads(kHkv);
        create.mutable_layout()->set_head_dim(kD);
        create.mutable_layout()->set_v_head_dim(kDv);
        create.set_cache_dtype(cache);
        v1::CreateSessionResponse created;
        grpc::ClientContext context;
        ASSERT_TRUE(stub_->CreateSession(&context, create, &created).ok());
        std::vector<float> out, lse;
        for (const auto& [from, to] :
             std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 6}, {6, 11}}) {
          v1::ExtendSessionRequest r = seq.Extend(created.session().session_id(), from, to);
          *r.mutable_query() = encode(r.query(), wire);
          *r.mutable_key() = encode(r.key(), wire);
          *r.mutable_value() = encode(r.value(), wire);
          r.set_return_lse(true);
          v1::ExtendSessionResponse response;
          const grpc::Status st = Extend(r, &response);
          ASSERT_TRUE(st.ok()) << st.error_message();
          ASSERT_EQ(response.output().dtype(), wire);
          const std::vector<float> o = decode(response.output());
          const std::vector<float> e = Floats(response.lse());
          out.insert(out.end(), o.begin(), o.end());
          lse.insert(lse.end(), e.begin(), e.end());
        }
        // The float64 expectation: q as sent; k and v rounded to the request's type, then to
        // the cache's.
        const std::vector<float> q = round_to(type_of(wire), seq.q);
        const std::vector<float> k = round_to(type_of(cache), round_to(type_of(wire), seq.k));
        const std::vector<float> v = round_to(type_of(cache), round_to(type_of(wire), seq.v));
        // The unit roundoff of the output type (rounding x moves it by at most |x| times it).
        const double roundoff = wire == v1::DTYPE_FLOAT32   ? 0.0
                                : wire == v1::DTYPE_FLOAT16 ? std::ldexp(1.0, -11)
                                                            : std::ldexp(1.0, -8);
        double worst_out = 0, worst_lse = 0;
        for (int64_t t = 0; t < seq.t; ++t) {
          for (int h = 0; h < kHq; ++h) {
            const int g = h / (kHq / kHkv);
            std::vector<double> w(static_cast<size_t>(t + 1));
            double max_score = -INFINITY;
            for (int64_t j = 0; j <= t; ++j) {
              double dot = 0;
              for (int c = 0; c < kD; ++c) {
                dot += double{q[(t * kHq + h) * kD + c]} * k[(j * kHkv + g) * kD + c];
              }
              w[j] = dot / std::sqrt(double{kD});
              max_score = std::max(max_score, w[j]);
            }
            double sum = 0;
            for (double& x : w) sum += x = std::exp(x - max_score);
            worst_lse =
                std::max(worst_lse, std::abs(lse[t * kHq + h] - (max_score + std::log(sum))));
            for (int c = 0; c < kDv; ++c) {
              double want = 0;
              for (int64_t j = 0; j <= t; ++j) want += w[j] / sum * v[(j * kHkv + g) * kDv + c];
              const double got = out[(t * kHq + h) * kDv + c];
              // Beyond the float32 arithmetic's 2e-5: one rounding of the output.
              worst_out = std::max(worst_out, std::abs(got - want) - std::abs(want) * roundoff);
            }
          }
        }
        EXPECT_LE(worst_out, 2e-5);
        EXPECT_LE(worst_lse, 2e-5);
      }
    }
  }
}

TEST_F(SessionTest, LogSumExpIsThatOfEachNewQuerysScores) {
  Start(SmallPages());
  const Sequence s(2, 1, 4, 4, 6, 11);
  const std::string id = CreateRaw(2, 1, 4, 4);
  Step(id, s, 0, 3);
  v1::ExtendSessionRequest r = s.Extend(id, 3, 6);
  r.set_return_lse(true);
  v1::ExtendSessionResponse response;
  ASSERT_TRUE(Extend(r, &response).ok());
  ASSERT_THAT(response.lse().shape(), ::testing::ElementsAre(3, 2));
  const std::vector<float> lse = Floats(response.lse());
  for (int64_t t = 3; t < 6; ++t) {
    for (int h = 0; h < 2; ++h) {
      double sum = 0;
      for (int64_t j = 0; j <= t; ++j) {
        double dot = 0;
        for (int c = 0; c < 4; ++c) dot += double(s.q[(t * 2 + h) * 4 + c]) * s.k[j * 4 + c];
        sum += std::exp(dot / 2.0);  // scale 1/sqrt(4)
      }
      EXPECT_NEAR(lse[(t - 3) * 2 + h], std::log(sum), 1e-5);
    }
  }
}

// On the reference backend and on the CPU backend (whose Project runs the projections on its
// pool, in chunks of rows, as its MultiHead does).
TEST_F(SessionTest, ModuleSessionsEqualMultiHeadAttentionAndTheSeedVectors) {
  for (const bool cpu : {false, true}) {
    ASSERT_NO_FATAL_FAILURE(Restart(SmallPages(), cpu));
    for (const std::string name : {"causal", "seed_demo"}) {
      SCOPED_TRACE(absl::StrCat(name, cpu ? " on the cpu backend" : " on the reference backend"));
      auto c = testing::LoadSeedCase(name);
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_TRUE(LoadModule("seed_" + name, c->bytes).ok());
      const int64_t d = c->weights.d_model, t = c->q_len;
      const std::vector<float> input(c->query.begin(), c->query.begin() + t * d);  // batch item 0
      v1::CreateSessionRequest create;
      create.set_module("seed_" + name);
      create.set_cache_dtype(v1::DTYPE_FLOAT32);
      const std::vector<float> got = PrefillHalfThenSteps(Create(create).session_id(), input, d, t);
      v1::MultiHeadAttentionRequest mha;
      mha.set_module("seed_" + name);
      *mha.mutable_query() = F32(input, {1, t, d});
      mha.mutable_options()->set_causal(true);
      v1::MultiHeadAttentionResponse expected;
      grpc::ClientContext context;
      ASSERT_TRUE(stub_->MultiHeadAttention(&context, mha, &expected).ok());
      EXPECT_LE(MaxAbsDiff(got, Floats(expected.output())), 1e-4);
      if (name == "causal") {  // its mask is the causal one: PyTorch's numbers
        const std::vector<float> torch(c->expected_output.begin(),
                                       c->expected_output.begin() + t * d);
        EXPECT_LE(MaxAbsDiff(got, torch), 1e-4);
      }
    }
  }
}

// Unloading a module leaves the sessions bound to it working on its weights (they hold them),
// until they are closed or lost; new sessions cannot bind to it.
TEST_F(SessionTest, AnUnloadedModulesSessionsKeepItsWeights) {
  Start(SmallPages());
  auto c = testing::LoadSeedCase("causal");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(LoadModule("m", c->bytes).ok());
  const int64_t d = c->weights.d_model, t = c->q_len;
  const std::vector<float> input(c->query.begin(), c->query.begin() + t * d);
  v1::CreateSessionRequest create;
  create.set_module("m");
  create.set_cache_dtype(v1::DTYPE_FLOAT32);
  const v1::SessionInfo created = Create(create);
  auto extend = [&](int64_t from, int64_t to) {
    v1::ExtendSessionRequest r;
    r.set_session_id(created.session_id());
    *r.mutable_input() = F32(Rows(input, d, from, to), {to - from, d});
    v1::ExtendSessionResponse response;
    const grpc::Status st = Extend(r, &response);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return Floats(response.output());
  };
  std::vector<float> got = extend(0, t / 2);
  {
    v1::UnloadModuleRequest unload;
    unload.set_name("m");
    v1::UnloadModuleResponse unloaded;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->UnloadModule(&context, unload, &unloaded).ok());
  }
  for (int64_t from = t / 2; from < t; ++from) {
    const std::vector<float> out = extend(from, from + 1);
    got.insert(got.end(), out.begin(), out.end());
  }
  const std::vector<float> torch(c->expected_output.begin(), c->expected_output.begin() + t * d);
  EXPECT_LE(MaxAbsDiff(got, torch), 1e-4);
  grpc::ClientContext context;
  v1::CreateSessionResponse refused;
  EXPECT_EQ(stub_->CreateSession(&context, create, &refused).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// Snapshots (ServerOptions::session_snapshot_dir): what a replica's sessions compute after a
// restart equals, bit for bit, what they compute on a server that never stopped.
TEST_F(SessionTest, ForksDivergeWithoutTouchingTheParent) {
  Start(SmallPages());
  const Sequence a(2, 2, 4, 4, 12, 21);  // parent: tokens 0..5 then a's 6..11
  Sequence b(2, 2, 4, 4, 12, 99);        // child: the same first 6 tokens, then b's own
  std::copy(a.q.begin(), a.q.begin() + 6 * 8, b.q.begin());
  std::copy(a.k.begin(), a.k.begin() + 6 * 8, b.k.begin());
  std::copy(a.v.begin(), a.v.begin() + 6 * 8, b.v.begin());
  const std::string parent = CreateRaw(2, 2, 4, 4);
  const std::vector<float> prefix = Step(parent, a, 0, 6);  // the last page is half full
  const std::string child = Fork(parent);
  v1::SessionInfo info;
  ASSERT_TRUE(Get(child, &info).ok());
  EXPECT_EQ(info.length(), 6);
  EXPECT_EQ(info.shared_pages(), 2);
  EXPECT_EQ(info.parent_id(), parent);
  EXPECT_EQ(Usage().pages_used(), 2);
  EXPECT_EQ(Usage().tokens(), 6);
  EXPECT_EQ(Metric("attnserve_session_pages_shared", {}), 2);
  EXPECT_EQ(Metric("attnserve_sessions_active", {}), 2);
  EXPECT_EQ(Metric("attnserve_session_pool_bytes_used", {}), 2 * 2 * 4 * 4 * 4 * 2);

  std::vector<float> got_b = prefix, got_a = prefix;
  for (int64_t i = 6; i < 12; ++i) {
    const std::vector<float> ob = Step(child, b, i, i + 1);
    const std::vector<float> oa = Step(parent, a, i, i + 1);
    got_b.insert(got_b.end(), ob.begin(), ob.end());
    got_a.insert(got_a.end(), oa.begin(), oa.end());
  }
  EXPECT_LE(MaxAbsDiff(got_a, CausalAttend(a, 12)), 1e-6);
  EXPECT_LE(MaxAbsDiff(got_b, CausalAttend(b, 12)), 1e-6);
  // The first page stays shared; each wrote its own copy of the second and a third of its own.
  EXPECT_EQ(Usage().pages_used(), 5);
  ASSERT_TRUE(Close(parent).ok());
  EXPECT_EQ(Usage().pages_used(), 3);
  ASSERT_TRUE(Close(child).ok());
  EXPECT_EQ(Usage().pages_used(), 0);
}

// A closed session's pages keep their memory for the next session (no page faulted in again),
// counted as kept, and the server gives them back once it has been idle (here 50 ms of no call:
// the wait is a poll with a generous bound, so a busy machine makes it slower, never wrong).
TEST_F(SessionTest, ClosedSessionsPagesAreKeptUntilTheServerIsIdle) {
  server::ServerOptions options = SmallPages();
  options.idle_release = absl::Milliseconds(50);
  Start(options);
  const Sequence s(2, 2, 4, 4, 12, 21);
  const std::string a = CreateRaw(2, 2, 4, 4);
  Step(a, s, 0, 6);  // two pages of 2 kv heads of 4 tokens of 4 + 4 float32: 256 bytes each
  ASSERT_TRUE(Close(a).ok());
  EXPECT_EQ(Usage().pages_used(), 0);
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  double kept = Metric("attnserve_session_pool_bytes_kept", {});
  // Kept at the close; given back once no call has come for 50 ms.
  EXPECT_TRUE(kept == 2 * 256 || kept == 0) << kept;
  while (kept != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    kept = Metric("attnserve_session_pool_bytes_kept", {});
  }
  EXPECT_EQ(kept, 0);
  // The next session gets pages again and computes as before.
  const std::string b = CreateRaw(2, 2, 4, 4);
  EXPECT_LE(MaxAbsDiff(Step(b, s, 0, 6), CausalAttend(s, 6)), 1e-6);
}

// 4 pages of 4 tokens of 1 kv head of D = Dv = 4 float32: 128 bytes a page.
server::ServerOptions FourPagePool(server::sessions::WhenFull when_full) {
  server::ServerOptions options = SmallPages();
  options.sessions.pool_bytes = 4 * 128;
  options.sessions.when_full = when_full;
  return options;
}

TEST_F(SessionTest, AFullPoolEvictsTheLeastRecentlyUsedIdleSession) {
  Start(FourPagePool(server::sessions::WhenFull::kEvictLru));
  const Sequence s(1, 1, 4, 4, 8, 5);
  const std::string a = CreateRaw(1, 1, 4, 4), b = CreateRaw(1, 1, 4, 4), c = CreateRaw(1, 1, 4, 4);
  Step(a, s, 0, 8);
  Step(b, s, 0, 8);
  ASSERT_TRUE(Get(a).ok());  // a is now more recently used than b
  Step(c, s, 0, 4);          // needs a page: b goes
  v1::ExtendSessionResponse response;
  std::string lost;
  const grpc::Status st = Extend(s.Extend(b, 0, 1), &response, &lost);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("session lost (evicted)"));
  EXPECT_EQ(lost, "evicted");
  EXPECT_TRUE(Get(a).ok());
  EXPECT_EQ(Get(b).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Close(b).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Metric("attnserve_sessions_lost_total", {"reason=\"evicted\""}), 1);
}

// A device reset takes the pages of the sessions held on the device (PageStore::lost): they
// answer "session lost (device reset)" like any lost session, and a new session of the same
// layout gets new memory and computes as before.
TEST_F(SessionTest, SessionsWhosePagesADeviceResetTookAreLostAndNewOnesWork) {
  auto inner = std::make_unique<testing::LosableStoreBackend>();
  testing::LosableStoreBackend* const backend = inner.get();
  Start(SmallPages(), std::move(inner));
  const Sequence s(2, 1, 4, 4, 9, 11);
  const std::string a = CreateRaw(2, 1, 4, 4), b = CreateRaw(2, 1, 4, 4);
  Step(a, s, 0, 5);
  Step(b, s, 0, 3);
  const std::string c = Fork(a);
  ASSERT_EQ(backend->stores().size(), 1u);
  backend->stores()[0]->Lose();  // its memory stays valid until its last page goes

  v1::ExtendSessionResponse response;
  std::string lost;
  const grpc::Status st = Extend(s.Extend(a, 5, 6), &response, &lost);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("session lost (device reset)"));
  EXPECT_EQ(lost, "device reset");
  for (const std::string& id : {b, c}) {
    const grpc::Status got = Get(id);
    EXPECT_EQ(got.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << id;
    EXPECT_THAT(got.error_message(), HasSubstr("session lost (device reset)")) << id;
  }
  EXPECT_EQ(Metric("attnserve_sessions_lost_total", {"reason=\"device_reset\""}), 3);
  EXPECT_EQ(Usage().pages_used(), 0);  // the lost store's pages are all freed

  const std::string d = CreateRaw(2, 1, 4, 4);
  EXPECT_EQ(backend->stores().size(), 2u);  // a new store for the layout
  std::vector<float> got = Step(d, s, 0, 7);
  const std::vector<float> more = Step(d, s, 7, 9);
  got.insert(got.end(), more.begin(), more.end());
  EXPECT_LE(MaxAbsDiff(got, CausalAttend(s, 9)), 1e-6);
}

TEST_F(SessionTest, AFullPoolInRefuseModeAnswersResourceExhaustedAndAppendsNothing) {
  Start(FourPagePool(server::sessions::WhenFull::kRefuse));
  const Sequence s(1, 1, 4, 4, 8, 5);
  const std::string a = CreateRaw(1, 1, 4, 4), b = CreateRaw(1, 1, 4, 4);
  Step(a, s, 0, 8);
  Step(b, s, 0, 8);
  v1::ExtendSessionResponse response;
  const grpc::Status st = Extend(s.Extend(a, 0, 1), &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("--session_when_full=refuse"));
  v1::SessionInfo info;
  ASSERT_TRUE(Get(a, &info).ok());
  EXPECT_EQ(info.length(), 8);
  ASSERT_TRUE(Get(b).ok());
  EXPECT_EQ(Usage().pages_used(), 4);
}

TEST_F(SessionTest, PinnedSessionsAreNeverEvictedAndHoldAtMostTheirShare) {
  server::ServerOptions options = FourPagePool(server::sessions::WhenFull::kEvictLru);
  options.sessions.max_pinned_fraction = 0.5;  // two of the four pages
  options.sessions.max_sessions = 3;
  Start(options);
  const Sequence s(1, 1, 4, 4, 9, 5);
  const std::string pinned = CreateRaw(1, 1, 4, 4, /*pinned=*/true);
  Step(pinned, s, 0, 8);  // its two pages: the pinned share is full
  v1::ExtendSessionResponse response;
  grpc::Status st = Extend(s.Extend(pinned, 8, 9), &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("--session_max_pinned_fraction"));
  // A pinned fork counts the two pages it shares with its pinned parent again (the proto's
  // ForkSessionRequest.pinned): over the share, refused; unpinned, it forks.
  {
    v1::ForkSessionRequest fork;
    fork.set_session_id(pinned);
    fork.set_pinned(true);
    v1::ForkSessionResponse forked;
    grpc::ClientContext context;
    st = stub_->ForkSession(&context, fork, &forked);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(st.error_message(), HasSubstr("fork it unpinned"));
  }
  ASSERT_TRUE(Close(Fork(pinned)).ok());
  v1::CreateSessionRequest create;
  create.mutable_layout()->set_num_heads(1);
  create.mutable_layout()->set_num_kv_heads(1);
  create.mutable_layout()->set_head_dim(4);
  create.set_cache_dtype(v1::DTYPE_FLOAT32);
  create.set_pinned(true);
  v1::CreateSessionResponse created;
  {
    grpc::ClientContext context;
    st = stub_->CreateSession(&context, create, &created);
  }
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("--session_max_pinned_fraction"));

  const std::string b = CreateRaw(1, 1, 4, 4), c = CreateRaw(1, 1, 4, 4);
  Step(b, s, 0, 8);
  ASSERT_TRUE(Get(b).ok());  // the pinned session is now the least recently used
  Step(c, s, 0, 4);          // b goes, not the pinned one
  EXPECT_TRUE(Get(pinned).ok());
  EXPECT_EQ(Get(b).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  create.set_pinned(false);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->CreateSession(&context, create, &created).ok());  // b's place
  }
  {
    grpc::ClientContext context;
    st = stub_->CreateSession(&context, create, &created);
  }
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("--max_sessions"));
}

TEST_F(SessionTest, AnExtendWhoseCallerIsGoneAppendsNothing) {
  Start(SmallPages());
  const Sequence s(1, 1, 4, 4, 3, 9);
  const std::string id = CreateRaw(1, 1, 4, 4);
  gate_->Close();
  const int calls = static_cast<int>(gate_->rows().size());
  std::thread late([&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    v1::ExtendSessionResponse response;
    EXPECT_EQ(stub_->ExtendSession(&context, s.Extend(id, 0, 2), &response).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  });
  gate_->AwaitCalls(calls + 1);  // computing: the server has the call, so its deadline (receipt
  // + 1 s, rounded up by at most a unit of the timeout header) is before `bound`: waiting past
  // it is a bound, not a window (as call_lifecycle_test's late answer).
  const absl::Time bound = absl::Now() + absl::Milliseconds(1100);
  late.join();  // the caller has given up
  absl::SleepFor(bound - absl::Now());
  gate_->Open();
  // Once the late extend's lease ends (until then: ABORTED "one at a time"), the session still
  // holds 0 tokens. 20 s of retries: a hang guard, not a window.
  v1::ExtendSessionRequest r = s.Extend(id, 0, 1);
  r.set_expected_length(0);
  grpc::Status st;
  v1::ExtendSessionResponse response;
  for (int i = 0; i < 4000; ++i) {
    st = Extend(r, &response);
    if (st.error_code() != grpc::StatusCode::ABORTED ||
        st.error_message().find("one at a time") == std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(response.length(), 1);
}

TEST_F(SessionTest, AnIdleSessionExpiresOnTheInjectedClock) {
  batching::FakeClock clock;
  server::ServerOptions options = SmallPages();
  options.sessions.clock = &clock;
  options.sessions.idle_ttl = absl::Seconds(10);
  Start(options);
  const std::string a = CreateRaw(1, 1, 4, 4), b = CreateRaw(1, 1, 4, 4);
  // A TTL above the server's is capped to it, and said so.
  v1::CreateSessionRequest long_ttl;
  long_ttl.mutable_layout()->set_num_heads(1);
  long_ttl.mutable_layout()->set_num_kv_heads(1);
  long_ttl.mutable_layout()->set_head_dim(4);
  long_ttl.set_cache_dtype(v1::DTYPE_FLOAT32);
  long_ttl.set_idle_ttl_us(3'600'000'000);
  v1::CreateSessionResponse created;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->CreateSession(&context, long_ttl, &created).ok());
  EXPECT_EQ(created.session().idle_ttl_us(), 10'000'000);
  clock.Advance(absl::Seconds(6));
  ASSERT_TRUE(Get(a).ok());          // describing is using: refreshes a
  EXPECT_EQ(Usage().sessions(), 3);  // listing is not: b is not refreshed
  clock.Advance(absl::Seconds(6));
  EXPECT_TRUE(Get(a).ok());
  std::string lost;
  v1::ExtendSessionResponse response;
  const Sequence s(1, 1, 4, 4, 1, 3);
  const grpc::Status st = Extend(s.Extend(b, 0, 1), &response, &lost);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("session lost (expired)"));
  EXPECT_EQ(lost, "expired");
  EXPECT_EQ(Usage().sessions(), 1);  // a; the capped one expired with b
  EXPECT_EQ(Metric("attnserve_sessions_lost_total", {"reason=\"expired\""}), 2);
}

TEST_F(SessionTest, AnIdOfAnotherInstanceIsLostRestartedAndBadIdsAreRefused) {
  server::ServerOptions options = SmallPages();
  options.sessions.owner = "replica-a";
  Start(options);
  const std::string id = CreateRaw(1, 1, 4, 4);
  EXPECT_THAT(id, ::testing::StartsWith("replica-a/"));
  // A second server process of the same replica (a restart): the first one's ids are lost.
  auto second = server::ServerHost::Start(options, std::make_unique<kernels::ReferenceBackend>(),
                                          metrics_.get());
  ASSERT_TRUE(second.ok());
  auto stub = v1::AttentionService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string((*second)->port()), grpc::InsecureChannelCredentials()));
  v1::GetSessionRequest get;
  get.set_session_id(id);
  v1::GetSessionResponse response;
  grpc::ClientContext context;
  const grpc::Status st = stub->GetSession(&context, get, &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("session lost (restarted)"));
  (*second)->Shutdown(absl::ZeroDuration());

  EXPECT_EQ(Get("").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Get("no-slashes").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Get(id + "x").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Get(id + "0").error_code(), grpc::StatusCode::INVALID_ARGUMENT);  // 33 digits
  std::string upper = id;  // the key is lowercase hex
  upper.back() = 'F';
  EXPECT_EQ(Get(upper).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  std::string other = id;  // a well-formed key never issued
  other.back() = other.back() == '0' ? '1' : '0';
  EXPECT_EQ(Get(other).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Get("replica-b/" + id.substr(10)).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Close(id).ok());
  EXPECT_EQ(Get(id).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Close(id).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(SessionTest, ASecondExtendWhileOneIsInFlightIsAbortedAndExpectedLengthIsChecked) {
  Start(SmallPages());
  const Sequence s(1, 1, 4, 4, 4, 13);
  const std::string id = CreateRaw(1, 1, 4, 4);
  gate_->Close();
  const int calls = static_cast<int>(gate_->batch_sizes().size());  // the server's warm-up too
  std::thread first([&] {
    v1::ExtendSessionResponse response;
    EXPECT_TRUE(Extend(s.Extend(id, 0, 2), &response).ok());
  });
  gate_->AwaitCalls(calls + 1);
  v1::ExtendSessionResponse response;
  grpc::Status st = Extend(s.Extend(id, 2, 3), &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(st.error_message(), HasSubstr("one at a time"));
  v1::ForkSessionRequest fork;
  fork.set_session_id(id);
  v1::ForkSessionResponse forked;
  grpc::ClientContext context;
  EXPECT_EQ(stub_->ForkSession(&context, fork, &forked).error_code(), grpc::StatusCode::ABORTED);
  gate_->Open();
  first.join();

  v1::ExtendSessionRequest r = s.Extend(id, 2, 3);
  r.set_expected_length(5);
  st = Extend(r, &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(st.error_message(), HasSubstr("holds 2 tokens"));
  r.set_expected_length(2);
  EXPECT_TRUE(Extend(r, &response).ok());
  EXPECT_EQ(response.length(), 3);
}

TEST_F(SessionTest, AStepsBitsDoNotDependOnItsBatchCompanions) {
  Start(SmallPages());
  const Sequence s(4, 2, 8, 8, 10, 31);
  const std::string alone = CreateRaw(4, 2, 8, 8), batched = CreateRaw(4, 2, 8, 8);
  Step(alone, s, 0, 9);
  Step(batched, s, 0, 9);
  const std::vector<float> expected = Step(alone, s, 9, 10);

  v1::ExtendSessionsRequest many;
  std::vector<std::unique_ptr<Sequence>> others;
  for (int i = 0; i < 3; ++i) {
    others.push_back(std::make_unique<Sequence>(4, 2, 8, 8, 5 + 7 * i, 40 + i));
    const std::string id = CreateRaw(4, 2, 8, 8);
    Step(id, *others.back(), 0, others.back()->t - 1);
    *many.add_steps() = others.back()->Extend(id, others.back()->t - 1, others.back()->t);
  }
  *many.add_steps() = s.Extend(batched, 9, 10);
  *many.add_steps() = s.Extend(batched, 9, 10);  // a session twice: that item is refused
  gate_->Close();
  const int calls = static_cast<int>(gate_->batch_sizes().size());
  v1::ExtendSessionsResponse response;
  std::thread caller([&] {
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->ExtendSessions(&context, many, &response).ok());
  });
  gate_->AwaitCalls(calls + 1);
  gate_->Open();
  caller.join();
  EXPECT_EQ(gate_->batch_sizes().back(), 4);  // one PagedAttention call for the four sessions
  ASSERT_EQ(response.results_size(), 5);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(response.results(i).code(), 0) << i;
  EXPECT_EQ(response.results(4).code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(response.results(4).message(), HasSubstr("steps[4]"));
  const std::vector<float> got = Floats(response.results(3).response().output());
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0);
}

TEST_F(SessionTest, ADecodeStepQueuedDuringAPrefillGoesBeforeThePrefillsNextChunk) {
  Start(SmallPages());
  const Sequence s(2, 1, 4, 4, 9, 23);
  const std::string prefilling = CreateRaw(2, 1, 4, 4), decoding = CreateRaw(2, 1, 4, 4);
  Step(decoding, s, 0, 4);
  gate_->Close();
  const int calls = static_cast<int>(gate_->rows().size());
  std::vector<float> prefill;
  std::thread prefiller([&] { prefill = Step(prefilling, s, 0, 9); });
  gate_->AwaitCalls(calls + 1);  // its first chunk is computing
  std::thread decoder([&] { Step(decoding, s, 4, 5); });
  // Waits until the step is queued (the batcher's gauge), as call_lifecycle_test does; 20 s is
  // far beyond any scheduling delay.
  bool queued = false;
  for (int i = 0; i < 4000 && !queued; ++i) {
    queued = Metric("attnserve_queued_requests", {}) >= 1;
    if (!queued) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(queued);
  gate_->Open();
  prefiller.join();
  decoder.join();
  const std::vector<int> rows = gate_->rows();
  EXPECT_THAT(std::vector<int>(rows.begin() + calls, rows.end()),
              ::testing::ElementsAre(3, 1, 3, 3));
  EXPECT_LE(MaxAbsDiff(prefill, CausalAttend(s, 9)), 1e-6);
}

TEST_F(SessionTest, StreamItemsExtendSessions) {
  Start(SmallPages());
  const Sequence s(2, 1, 4, 4, 3, 17);
  const std::string id = CreateRaw(2, 1, 4, 4);
  grpc::ClientContext context;
  auto stream = stub_->AttentionStream(&context);
  v1::AttentionStreamRequest request;
  request.set_request_id(1);
  *request.mutable_extend_session() = s.Extend(id, 0, 2);
  ASSERT_TRUE(stream->Write(request));
  v1::AttentionStreamResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.code(), 0) << response.message();
  EXPECT_EQ(response.extend_session().length(), 2);
  request.set_request_id(2);
  *request.mutable_extend_sessions()->add_steps() = s.Extend(id, 2, 3);
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_EQ(response.extend_sessions().results_size(), 1);
  EXPECT_EQ(response.extend_sessions().results(0).response().length(), 3);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(SessionTest, ListSessionsPagesThroughEverySessionByIdOnce) {
  Start(SmallPages());
  // Twelve: ids numbered 1 to 12, which are listed in that order ("/10" after "/9", not after
  // "/1" as text would have it), the order they were created in.
  std::vector<std::string> created;
  for (int i = 0; i < 12; ++i) created.push_back(CreateRaw(1, 1, 4, 4));
  std::vector<std::string> listed;
  std::string token;
  int pages = 0;
  do {
    v1::ListSessionsRequest r;
    r.set_page_size(5);
    r.set_page_token(token);
    v1::ListSessionsResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->ListSessions(&context, r, &response).ok());
    for (const auto& info : response.sessions()) listed.push_back(info.session_id());
    EXPECT_EQ(response.usage().sessions(), 12);
    token = response.next_page_token();
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(listed, created);
  v1::ListSessionsRequest bad;
  bad.set_page_token("not-a-token");
  v1::ListSessionsResponse response;
  grpc::ClientContext context;
  const grpc::Status st = stub_->ListSessions(&context, bad, &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("page_token"));
}

TEST_F(SessionTest, ServerInfoReportsTheSessionSettings) {
  server::ServerOptions options = SmallPages();
  options.sessions.pool_bytes = 1 << 20;
  options.sessions.when_full = server::sessions::WhenFull::kRefuse;
  options.sessions.max_sessions = 77;
  Start(options);
  v1::GetServerInfoResponse info;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->GetServerInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.sessions().page_tokens(), 4);
  EXPECT_EQ(info.sessions().pool_bytes(), 1 << 20);
  EXPECT_EQ(info.sessions().when_full(), v1::WHEN_POOL_FULL_REFUSE);
  EXPECT_EQ(info.sessions().owner(), "127.0.0.1:" + std::to_string(host_->port()));
  EXPECT_EQ(info.limits().max_sessions(), 77);
}

TEST_F(SessionTest, BadRequestsNameTheFieldAndTheValue) {
  Start(SmallPages());
  v1::CreateSessionRequest create;
  create.mutable_layout()->set_num_heads(3);
  create.mutable_layout()->set_num_kv_heads(2);
  create.mutable_layout()->set_head_dim(4);
  create.set_cache_dtype(v1::DTYPE_FLOAT32);
  v1::CreateSessionResponse created;
  grpc::ClientContext c1;
  grpc::Status st = stub_->CreateSession(&c1, create, &created);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("layout.num_heads (3)"));
  const std::string id = CreateRaw(2, 1, 4, 4);
  const Sequence wrong(2, 1, 8, 4, 2, 1);  // head_dim 8, the session's is 4
  v1::ExtendSessionResponse response;
  st = Extend(wrong.Extend(id, 0, 2), &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(),
              HasSubstr("query.shape[2] must equal the session's head_dim (4); was 8"));
  v1::SessionInfo info;
  ASSERT_TRUE(Get(id, &info).ok());
  EXPECT_EQ(info.length(), 0);
  const Sequence right(2, 1, 4, 4, 2, 1);
  EXPECT_TRUE(Extend(right.Extend(id, 0, 2), &response).ok());  // not left busy
}

// Keys and values stay in the cache, where a NaN or an infinity would make every later step NaN:
// they are refused, naming the element, in every dtype, and nothing is appended. Queries are
// not cached: a NaN query makes its own rows NaN (attention_params.h's NaN rule) and no others.
TEST_F(SessionTest, NonFiniteKeysAndValuesAreRefusedAndNeverCached) {
  Start(SmallPages());
  const std::string id = CreateRaw(2, 1, 4, 4);
  const Sequence s(2, 1, 4, 4, 4, 5);
  for (const v1::Dtype dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    for (const bool in_value : {false, true}) {
      for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
        SCOPED_TRACE(absl::StrCat(v1::Dtype_Name(dtype), in_value ? " value " : " key ", bad));
        Sequence poisoned = s;
        // Token 2, kv head 0, column 3: element 2 * 4 + 3 = 11.
        (in_value ? poisoned.v : poisoned.k)[11] = bad;
        v1::ExtendSessionRequest r = poisoned.Extend(id, 0, 3);
        if (dtype != v1::DTYPE_FLOAT32) {
          *r.mutable_query() = Encode(r.query(), dtype);
          *r.mutable_key() = Encode(r.key(), dtype);
          *r.mutable_value() = Encode(r.value(), dtype);
        }
        v1::ExtendSessionResponse response;
        const grpc::Status st = Extend(r, &response);
        EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
        EXPECT_THAT(st.error_message(),
                    HasSubstr(absl::StrCat(in_value ? "value" : "key", " must be finite")));
        EXPECT_THAT(st.error_message(), HasSubstr("at element 11 (token 2, kv head 0, column 3)"));
        v1::SessionInfo info;
        ASSERT_TRUE(Get(id, &info).ok());
        EXPECT_EQ(info.length(), 0);
      }
    }
  }
  Sequence nan_query = s;
  nan_query.q[1 * 2 * 4 + 0] = std::nanf("");  // token 1, head 0
  v1::ExtendSessionResponse response;
  ASSERT_TRUE(Extend(nan_query.Extend(id, 0, 3), &response).ok());
  const std::vector<float> out = Floats(response.output());  // [3, 2, 4]
  for (size_t e = 0; e < out.size(); ++e) {
    EXPECT_EQ(std::isnan(out[e]), e / 4 == 2) << e;  // row (token 1, head 0) only
  }
  // The cache holds no NaN: the next step's rows are all finite.
  ASSERT_TRUE(Extend(s.Extend(id, 3, 4), &response).ok());
  for (float x : Floats(response.output())) EXPECT_TRUE(std::isfinite(x));
}

// Thousands of create / extend / fork / extend / close cycles through the manager itself leave
// the pool empty: every page is accounted for.
// Expiry by the expiry heap, on a fake clock: of 2,000 sessions, those used since expire later
// and the others at their time, through many uses (which rebuild the heap of stale entries); a
// busy session is not expired while its extend runs, and is once it rolls back past its time.
TEST(SessionManagerTest, SessionsExpireAtTheirTimeAmongThousands) {
  batching::FakeClock clock;
  server::sessions::SessionOptions options;
  options.page_tokens = 4;
  options.pool_bytes = 1 << 20;
  options.clock = &clock;
  options.idle_ttl = absl::Seconds(10);
  auto manager = server::sessions::SessionManager::Create(options, nullptr).value();
  server::sessions::SessionSpec spec;
  spec.num_heads = spec.num_kv_heads = 1;
  spec.head_dim = spec.v_head_dim = 4;
  std::vector<std::string> ids;
  for (int i = 0; i < 2000; ++i) ids.push_back(manager->Create(spec).value().id);
  clock.Advance(absl::Seconds(6));
  for (int round = 0; round < 10; ++round) {  // 10,000 uses: the heap is rebuilt on the way
    for (size_t i = 0; i < ids.size(); i += 2) ASSERT_TRUE(manager->Get("", ids[i]).ok());
  }
  clock.Advance(absl::Seconds(5));  // t = 11 s: the unused ones are due (10 s)
  EXPECT_EQ(manager->Usage().sessions, 1000);
  EXPECT_EQ(manager->Get("", ids[1]).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(manager->Get("", ids[2]).ok());  // used at 6 s (and now): due at 21 s
  server::sessions::ExtendItem item;
  ASSERT_TRUE(manager->BeginExtend("", ids[0], std::nullopt, 1, &item).ok());
  clock.Advance(absl::Seconds(20));  // t = 31 s: every session is due; ids[0] is busy
  EXPECT_EQ(manager->Usage().sessions, 1);
  item.lease.End(false);  // rolled back: not a use, so it is due since 16 s
  EXPECT_EQ(manager->Usage().sessions, 0);
}

// A tenant probing another tenant's session ids gets one log line every 10 s (on the manager's
// clock), the next one saying how many it left out; every probe is still answered as an id
// never issued.
TEST(SessionManagerTest, CrossTenantProbesAreLoggedOnceATenantEveryTenSeconds) {
  batching::FakeClock clock;
  server::sessions::SessionOptions options;
  options.page_tokens = 4;
  options.pool_bytes = 1 << 20;
  options.clock = &clock;
  auto manager = server::sessions::SessionManager::Create(options, nullptr).value();
  server::sessions::SessionSpec spec;
  spec.num_heads = spec.num_kv_heads = 1;
  spec.head_dim = spec.v_head_dim = 4;
  spec.tenant = "alice";
  const std::string alices = manager->Create(spec).value().id;
  const std::string line = "GetSession by tenant 'mallory' of another tenant's session refused";
  const auto count = [](const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(manager->Get("mallory", alices).status().code(), absl::StatusCode::kNotFound);
  }
  clock.Advance(absl::Seconds(9));
  EXPECT_EQ(manager->Get("mallory", alices).status().code(), absl::StatusCode::kNotFound);
  const std::string first = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(first, line), 1) << first;
  EXPECT_EQ(count(first, "more by it"), 0) << first;
  ::testing::internal::CaptureStderr();
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(manager->Get("mallory", alices).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager->Get("trudy", alices).status().code(), absl::StatusCode::kNotFound);
  const std::string second = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(second, line + " (and 100 more by it since its last such line)"), 1) << second;
  EXPECT_EQ(count(second, "by tenant 'trudy'"), 1) << second;  // throttled apart
}

TEST(SessionManagerTest, ThousandsOfCyclesLeakNoPage) {
  server::sessions::SessionOptions options;
  options.page_tokens = 4;
  options.pool_bytes = 1 << 20;
  auto manager = server::sessions::SessionManager::Create(options, nullptr).value();
  kernels::ReferenceBackend backend;
  std::mt19937 gen(5);
  const auto extend = [&](const std::string& id, int64_t n) {
    server::sessions::ExtendItem item;
    const std::vector<float> q = Random(n * 2 * 4, gen()), kv = Random(n * 4, gen());
    ASSERT_TRUE(manager->BeginExtend("", id, std::nullopt, n, &item).ok());
    item.q = q.data();
    item.k = item.v = kv.data();
    server::sessions::ExtendItem* items[] = {&item};
    manager->Compute(items, &backend);
    ASSERT_TRUE(item.status.ok()) << item.status;
    item.lease.End(gen() % 8 != 0);  // some roll back
  };
  server::sessions::SessionSpec spec;
  spec.num_heads = 2;
  spec.num_kv_heads = 1;
  spec.head_dim = spec.v_head_dim = 4;
  for (int i = 0; i < 3000; ++i) {
    const std::string a = manager->Create(spec).value().id;
    extend(a, 1 + gen() % 9);
    const std::string b = manager->Fork("", a, false, absl::ZeroDuration()).value().id;
    extend(b, 1 + gen() % 3);
    extend(a, 1);
    if (i % 2 == 0) {
      ASSERT_TRUE(manager->Close("", a).ok());
      ASSERT_TRUE(manager->Close("", b).ok());
    } else {
      ASSERT_TRUE(manager->Close("", b).ok());
      ASSERT_TRUE(manager->Close("", a).ok());
    }
  }
  const server::sessions::PoolUsage usage = manager->Usage();
  EXPECT_EQ(usage.sessions, 0);
  EXPECT_EQ(usage.pages_used, 0);
  EXPECT_EQ(usage.bytes_used, 0);
}

}  // namespace
}  // namespace attnserve
