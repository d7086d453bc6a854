#include "server/transport/request_builder.h"

#include <vector>

#include "client/client.h"
#include "gtest/gtest.h"

namespace attnserve::server {
namespace {

TEST(RequestBuilderTest, AttendJobDescribesTheRequest) {
  v1::AttendRequest r;
  *r.mutable_query() = MakeTensor(v1::DTYPE_BFLOAT16, {2, 4, 3, 8}, std::vector<float>(192, 1));
  *r.mutable_key() = MakeTensor(v1::DTYPE_BFLOAT16, {2, 2, 5, 8}, std::vector<float>(160, 1));
  *r.mutable_value() = MakeTensor(v1::DTYPE_BFLOAT16, {2, 2, 5, 6}, std::vector<float>(120, 1));
  r.mutable_options()->set_return_weights(true);
  r.mutable_options()->add_key_lengths(5);
  r.mutable_options()->add_key_lengths(0);
  auto job = BuildAttendJob(r, Limits());
  ASSERT_TRUE(job.ok()) << job.status();
  const kernels::AttentionParams& p = (*job)->attend;
  EXPECT_EQ(p.group_size(), 2);
  EXPECT_EQ(p.v_head_dim, 6);
  EXPECT_EQ(p.q.batch_stride, 4 * 3 * 8);
  EXPECT_EQ(p.v.head_stride, 5 * 6);
  EXPECT_EQ(p.key_lengths[1], 0);
  EXPECT_FLOAT_EQ(p.scale, 1.0f / std::sqrt(8.0f));
  EXPECT_NE(p.weights, nullptr);
  EXPECT_EQ((*job)->tokens, 2 * 3);
  EXPECT_EQ((*job)->out_shape, (std::vector<int64_t>{2, 4, 3, 6}));
  EXPECT_EQ((*job)->weights_shape, (std::vector<int64_t>{2, 4, 3, 5}));
  EXPECT_EQ((*job)->dtype, kernels::DType::kBFloat16);
}

// AttentionOptions.window, softcap and alibi reach the kernel parameters; the standard ALiBi
// slopes are the paper's (BLOOM's for a head count that is not a power of two).
TEST(RequestBuilderTest, ScoreModsReachTheKernelParameters) {
  auto request = [](int64_t heads) {
    v1::AttendRequest r;
    const int64_t n = heads * 3 * 8;
    *r.mutable_query() = MakeTensor(v1::DTYPE_FLOAT32, {1, heads, 3, 8}, std::vector<float>(n, 1));
    *r.mutable_key() = MakeTensor(v1::DTYPE_FLOAT32, {1, 1, 3, 8}, std::vector<float>(24, 1));
    *r.mutable_value() = MakeTensor(v1::DTYPE_FLOAT32, {1, 1, 3, 8}, std::vector<float>(24, 1));
    r.mutable_options()->mutable_window()->set_left(5);
    r.mutable_options()->mutable_window()->set_right(-1);
    r.mutable_options()->set_softcap(30.0f);
    r.mutable_options()->mutable_alibi()->set_standard(true);
    return r;
  };
  auto eight = BuildAttendJob(request(8), Limits());
  ASSERT_TRUE(eight.ok()) << eight.status();
  const kernels::ScoreMods& mods = (*eight)->attend.mods;
  EXPECT_EQ(mods.window_left, 5);
  EXPECT_EQ(mods.window_right, -1);
  EXPECT_EQ(mods.softcap, 30.0f);
  ASSERT_NE(mods.alibi_slopes, nullptr);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(mods.alibi_slopes[h], std::ldexp(1.0f, -(h + 1))) << h;
  // 6 heads: the 4 slopes of 4 heads (2^-2, 2^-4, 2^-6, 2^-8), then 2^-1 and 2^-3 of 8 heads.
  auto six = BuildAttendJob(request(6), Limits());
  ASSERT_TRUE(six.ok()) << six.status();
  EXPECT_EQ((*six)->alibi_slopes,
            (std::vector<float>{0.25f, 0.0625f, 1.0f / 64, 1.0f / 256, 0.5f, 0.125f}));
}

// Linear attention reaches the kernel parameters; a backend without it refuses it
// UNIMPLEMENTED, naming the option (the CUDA backend, for now).
TEST(RequestBuilderTest, LinearAttentionReachesTheKernelOrIsRefused) {
  v1::AttendRequest r;
  *r.mutable_query() = MakeTensor(v1::DTYPE_FLOAT32, {1, 2, 3, 8}, std::vector<float>(48, 1));
  *r.mutable_key() = MakeTensor(v1::DTYPE_FLOAT32, {1, 2, 3, 8}, std::vector<float>(48, 1));
  *r.mutable_value() = MakeTensor(v1::DTYPE_FLOAT32, {1, 2, 3, 8}, std::vector<float>(48, 1));
  r.mutable_options()->set_kind(v1::ATTENTION_KIND_LINEAR);
  r.mutable_options()->set_feature_map(v1::FEATURE_MAP_IDENTITY);
  auto job = BuildAttendJob(r, Limits());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ((*job)->attend.kind, kernels::AttentionKind::kLinear);
  EXPECT_EQ((*job)->attend.feature_map, kernels::FeatureMap::kIdentity);
  Limits without;
  without.linear_attention = false;
  auto refused = BuildAttendJob(r, without);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(refused.status().message().find("options.kind ATTENTION_KIND_LINEAR"),
            std::string::npos);
  r.mutable_options()->set_kind(v1::ATTENTION_KIND_SOFTMAX);
  r.mutable_options()->clear_feature_map();
  EXPECT_TRUE(BuildAttendJob(r, without).ok());
  r.mutable_options()->clear_kind();  // unset: softmax
  EXPECT_TRUE(BuildAttendJob(r, without).ok());
}

TEST(RequestBuilderTest, SignatureSeparatesKernelChangingShapes) {
  auto make = [](int64_t d, v1::Dtype dtype) {
    v1::AttendRequest r;
    *r.mutable_query() = MakeTensor(dtype, {1, 1, 2, d}, std::vector<float>(2 * d, 1));
    *r.mutable_key() = MakeTensor(dtype, {1, 1, 3, d}, std::vector<float>(3 * d, 1));
    *r.mutable_value() = MakeTensor(dtype, {1, 1, 3, d}, std::vector<float>(3 * d, 1));
    return BuildAttendJob(r, Limits()).value()->signature;
  };
  EXPECT_EQ(make(8, v1::DTYPE_FLOAT32), make(8, v1::DTYPE_FLOAT32));
  EXPECT_NE(make(8, v1::DTYPE_FLOAT32), make(16, v1::DTYPE_FLOAT32));
  EXPECT_NE(make(8, v1::DTYPE_FLOAT32), make(8, v1::DTYPE_FLOAT16));
}

TEST(RequestBuilderTest, MultiHeadWithoutKeyAndValueIsSelfAttention) {
  ModuleRegistry modules;
  ASSERT_TRUE(modules.Add(DemoModule(), false).ok());
  v1::MultiHeadAttentionRequest r;
  r.set_module("demo");
  *r.mutable_query() = MakeTensor(v1::DTYPE_FLOAT32, {3, 7, 64}, std::vector<float>(3 * 7 * 64));
  auto job = BuildMultiHeadJob(r, modules, Limits());
  ASSERT_TRUE(job.ok()) << job.status();
  const kernels::MultiHeadParams& p = (*job)->multi_head;
  EXPECT_TRUE(p.self_attention);
  EXPECT_EQ(p.key, p.query);
  EXPECT_EQ(p.kv_len, 7);
  EXPECT_FLOAT_EQ(p.scale, 1.0f / 4);  // d_k = 64 / 4 = 16
  EXPECT_EQ((*job)->tokens, 21);
  // A module unloaded while the job waits stays alive through the job's reference.
  ASSERT_TRUE(modules.Remove("demo").ok());
  EXPECT_EQ(p.module->d_model, 64);
}

}  // namespace
}  // namespace attnserve::server
