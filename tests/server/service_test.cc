// An in-process server (the same ServerHost main() runs) called through attnserve::Client.
#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "base/mutex.h"
#include "base/strings.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/reference.h"
#include "server/server_host.h"
#include "server/transport/attention_service.h"
#include "server/transport/request_builder.h"
#include "server/transport/wire.h"
#include "tests/testing/exposition.h"
#include "tests/testing/requests.h"
#include "tests/testing/seed_vectors.h"

namespace attnserve {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;

using testing::AttendCase;
using testing::MaxAbsError;

std::vector<float> Random(size_t n, uint32_t seed) { return testing::RandomNormal(n, seed); }

AttendCase MakeAttendCase(v1::Dtype dtype, int b, int hq, int hkv, int lq, int lk, int d, int dv,
                          bool causal, bool weights) {
  return testing::MakeAttendCase(dtype, {b, hq, hkv, lq, lk, d, dv}, causal, weights);
}

class ServiceTest : public ::testing::Test {
 protected:
  void StartServer(server::ServerOptions options = {}) {
    options.listen_address = "127.0.0.1:0";
    metrics_ = metrics::Metrics::Create({}).value();
    auto host = server::ServerHost::Start(options, metrics_.get());
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = *std::move(host);
    auto client = Client::Create("127.0.0.1:" + std::to_string(host_->port()));
    ASSERT_TRUE(client.ok());
    client_ = *std::move(client);
  }
  void SetUp() override { StartServer(); }

  // The grpc.health.v1 status of the whole server: 1 = SERVING, 2 = NOT_SERVING.
  int HealthStatus() {
    grpc::GenericStub stub(client_->channel().shared_from_this());
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::ByteBuffer request, response;  // empty HealthCheckRequest: service ""
    grpc::Slice empty("");
    request = grpc::ByteBuffer(&empty, 1);
    Mutex mu;
    CondVar cv;
    bool done = false;
    grpc::Status status;
    stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                   &response, [&](grpc::Status s) {
                     MutexLock lock(&mu);
                     status = s;
                     done = true;
                     cv.NotifyOne();
                   });
    MutexLock lock(&mu);
    while (!done) cv.Wait(&mu);
    if (!status.ok()) return -1;
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(response.Dump(&slices).ok());
    std::string bytes;
    for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    // HealthCheckResponse { ServingStatus status = 1; } -> bytes 0x08 <status>
    return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : 0;
  }

  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<server::ServerHost> host_;
  std::unique_ptr<Client> client_;
};

TEST_F(ServiceTest, AttendMatchesTheFloat64Reference) {
  AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, 2, 4, 2, 7, 9, 16, 8, true, true);
  auto response = client_->Attend(c.request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->output().dtype(), v1::DTYPE_FLOAT32);
  EXPECT_THAT(response->output().shape(), ::testing::ElementsAre(2, 4, 7, 8));
  EXPECT_THAT(response->weights().shape(), ::testing::ElementsAre(2, 4, 7, 9));
  EXPECT_LE(MaxAbsError(TensorToFloats(response->output()).value(), c.expected.out), 1e-5);
  EXPECT_LE(MaxAbsError(TensorToFloats(response->weights()).value(), c.expected.weights), 1e-6);
  const v1::Timing& t = response->timing();
  EXPECT_EQ(t.batch_size(), 1);
  EXPECT_FALSE(t.backend().empty());
  EXPECT_GE(t.server_us(), t.queued_us() + t.compute_us());
}

TEST_F(ServiceTest, HalfPrecisionRequestsAnswerInTheirOwnDType) {
  for (v1::Dtype dtype : {v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    AttendCase c = MakeAttendCase(dtype, 1, 2, 2, 5, 6, 8, 8, false, false);
    auto response = client_->Attend(c.request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->output().dtype(), dtype);
    EXPECT_FALSE(response->has_weights());
    // Outputs are |x| < 4 here; one rounding to the output dtype is the only error.
    const double ulp = dtype == v1::DTYPE_FLOAT16 ? 4.0 / 1024 : 4.0 / 128;
    EXPECT_LE(MaxAbsError(TensorToFloats(response->output()).value(), c.expected.out), ulp / 2);
  }
}

TEST_F(ServiceTest, SeedVectorsRoundTripThroughLoadModuleAndMultiHeadAttention) {
  for (const std::string& name : testing::SeedCaseNames()) {
    SCOPED_TRACE(name);
    auto c = testing::LoadSeedCase(name);
    ASSERT_TRUE(c.ok()) << c.status();
    v1::LoadModuleRequest load;
    load.set_name("seed-" + name);
    load.set_safetensors(c->bytes);
    auto loaded = client_->LoadModule(load);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->module().d_model(), c->weights.d_model);
    EXPECT_EQ(loaded->module().num_heads(), c->weights.num_heads);
    EXPECT_EQ(loaded->module().source(), "rpc");

    v1::MultiHeadAttentionRequest request;
    request.set_module("seed-" + name);
    *request.mutable_query() = MakeTensor(v1::DTYPE_FLOAT32, c->query_shape, c->query);
    if (!c->self_attention) {
      *request.mutable_key() = MakeTensor(v1::DTYPE_FLOAT32, c->key_shape, c->key);
      *request.mutable_value() = MakeTensor(v1::DTYPE_FLOAT32, c->key_shape, c->value);
    }
    if (!c->mask.empty()) {
      *request.mutable_options()->mutable_mask() = MakeMask(c->mask_shape, c->mask);
    }
    request.mutable_options()->set_return_weights(true);
    auto response = client_->MultiHeadAttention(request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_LE(testing::MaxAbsDiff(TensorToFloats(response->output()).value(), c->expected_output),
              1e-5);
    EXPECT_LE(testing::MaxAbsDiff(TensorToFloats(response->weights()).value(), c->expected_weights),
              1e-5);
  }
}

TEST_F(ServiceTest, ModulesCanBeListedReplacedAndUnloaded) {
  auto list = client_->ListModules();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->modules_size(), 1);
  EXPECT_EQ(list->modules(0).name(), "demo");
  EXPECT_EQ(list->modules(0).source(), "builtin");

  auto c = testing::LoadSeedCase("cross_padding");
  ASSERT_TRUE(c.ok());
  v1::LoadModuleRequest load;
  load.set_name("m");
  load.set_safetensors(c->bytes);
  ASSERT_TRUE(client_->LoadModule(load).ok());
  EXPECT_EQ(client_->LoadModule(load).status().code(), absl::StatusCode::kAlreadyExists);
  load.set_replace(true);
  load.set_num_heads(2);  // overrides the metadata's 4
  auto replaced = client_->LoadModule(load);
  ASSERT_TRUE(replaced.ok());
  EXPECT_EQ(replaced->module().num_heads(), 2);
  EXPECT_EQ(client_->ListModules()->modules_size(), 2);

  v1::UnloadModuleRequest unload;
  unload.set_name("m");
  EXPECT_TRUE(client_->UnloadModule(unload).ok());
  EXPECT_EQ(client_->UnloadModule(unload).status().code(), absl::StatusCode::kNotFound);
  v1::MultiHeadAttentionRequest request;
  request.set_module("m");
  *request.mutable_query() = MakeTensor(v1::DTYPE_FLOAT32, {1, 1, 64}, Random(64, 1));
  auto gone = client_->MultiHeadAttention(request);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("'m'"));
}

TEST_F(ServiceTest, ServerInfoDescribesBackendLimitsAndVersion) {
  auto info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->version().empty());
  ASSERT_GE(info->backends_size(), 1);
  int active = 0;
  for (const auto& b : info->backends()) active += b.active() ? 1 : 0;
  EXPECT_EQ(active, 1);
  EXPECT_EQ(info->limits().max_head_dim(), 256);
  EXPECT_FALSE(info->float32_precision().empty());
}

TEST_F(ServiceTest, CpuFloat32PrecisionIsReportedAndChecked) {
  server::ServerOptions options;
  options.backend = "cpu";
  options.cpu_float32_precision = "bf16";
  host_.reset();
  StartServer(options);
  auto info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok());
  // "bf16: ..." where the CPU has a 16-bit path (AVX512_BF16), else "fp32: ...".
  const auto* cpu = dynamic_cast<const kernels::cpu::CpuBackend*>(&host_->backend());
  ASSERT_NE(cpu, nullptr);
  EXPECT_THAT(
      info->float32_precision(),
      ::testing::StartsWith(cpu->bf16_isa() != kernels::cpu::Bf16Isa::kNone ? "bf16: " : "fp32: "));
  options.cpu_float32_precision = "fp16";
  auto bad = server::ServerHost::Start(options, metrics_.get());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("'fp16'"));
}

TEST_F(ServiceTest, CpuMinFlopsPerThreadIsChecked) {
  server::ServerOptions options;
  options.backend = "cpu";
  options.listen_address = "127.0.0.1:0";
  options.cpu_min_flops_per_thread = -1;
  auto bad = server::ServerHost::Start(options, metrics_.get());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("--cpu_min_flops_per_thread must be >= 0; was -1"));
  options.cpu_min_flops_per_thread = 0;  // every step on every thread: a valid setting
  auto good = server::ServerHost::Start(options, metrics_.get());
  EXPECT_TRUE(good.ok()) << good.status();
}

TEST_F(ServiceTest, HealthIsServingUntilShutdown) {
  EXPECT_EQ(HealthStatus(), 1);
  host_->Shutdown(absl::Seconds(1));
  EXPECT_NE(HealthStatus(), 1);
}

TEST_F(ServiceTest, ModuleRpcsCanBeSwitchedOff) {
  server::ServerOptions options;
  options.allow_module_rpc = false;
  host_.reset();
  StartServer(options);
  v1::LoadModuleRequest load;
  load.set_name("x");
  auto status = client_->LoadModule(load).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("--allow_module_rpc"));
  v1::UnloadModuleRequest unload;
  unload.set_name("demo");
  EXPECT_EQ(client_->UnloadModule(unload).status().code(), absl::StatusCode::kPermissionDenied);
}

// --- Malformed requests: each gets INVALID_ARGUMENT naming the problem; the server keeps
// serving.

struct Malformed {
  const char* name;
  std::function<void(v1::AttendRequest*)> mutate;
  absl::StatusCode code;
  const char* message;
};

v1::AttendRequest ValidAttend() {
  return MakeAttendCase(v1::DTYPE_FLOAT32, 2, 4, 2, 3, 5, 8, 8, false, false).request;
}

TEST_F(ServiceTest, MalformedAttendRequestsGetClearErrors) {
  using absl::StatusCode;
  const Malformed cases[] = {
      {"missing key", [](auto* r) { r->clear_key(); }, StatusCode::kInvalidArgument,
       "key is required"},
      {"dtype unspecified", [](auto* r) { r->mutable_query()->set_dtype(v1::DTYPE_UNSPECIFIED); },
       StatusCode::kInvalidArgument,
       "query.dtype must be FLOAT32, FLOAT16 or BFLOAT16; was DTYPE_UNSPECIFIED"},
      {"dtype unknown number",
       [](auto* r) { r->mutable_query()->set_dtype(static_cast<v1::Dtype>(42)); },
       StatusCode::kInvalidArgument, "was 42"},
      {"bool query", [](auto* r) { r->mutable_query()->set_dtype(v1::DTYPE_BOOL); },
       StatusCode::kInvalidArgument,
       "query.dtype must be FLOAT32, FLOAT16 or BFLOAT16; was DTYPE_BOOL"},
      {"mixed dtypes",
       [](auto* r) {
         *r->mutable_key() = MakeTensor(v1::DTYPE_FLOAT16, {2, 2, 5, 8}, std::vector<float>(160));
       },
       StatusCode::kInvalidArgument,
       "key.dtype must equal query.dtype (DTYPE_FLOAT32); was DTYPE_FLOAT16"},
      {"wrong byte count", [](auto* r) { r->mutable_query()->mutable_data()->pop_back(); },
       StatusCode::kInvalidArgument, "query.data must hold 768 bytes"},
      {"rank 3", [](auto* r) { r->mutable_query()->mutable_shape()->RemoveLast(); },
       StatusCode::kInvalidArgument, "query.shape must have 4 dimensions; was [2, 4, 3]"},
      {"zero dim", [](auto* r) { r->mutable_key()->set_shape(2, 0); }, StatusCode::kInvalidArgument,
       "key.shape[2] must be >= 1; was 0"},
      {"negative dim", [](auto* r) { r->mutable_value()->set_shape(3, -8); },
       StatusCode::kInvalidArgument, "value.shape[3] must be >= 1; was -8"},
      {"overflowing dims", [](auto* r) { r->mutable_query()->set_shape(0, int64_t{1} << 62); },
       StatusCode::kResourceExhausted, "more than the limit"},
      {"batch mismatch",
       [](auto* r) {
         r->mutable_key()->set_shape(0, 1);
         r->mutable_key()->mutable_data()->resize(320);
       },
       StatusCode::kInvalidArgument, "key.shape[0] must equal query.shape[0] (2); was 1"},
      {"head dim mismatch",
       [](auto* r) {
         *r->mutable_key() = MakeTensor(v1::DTYPE_FLOAT32, {2, 2, 5, 4}, std::vector<float>(80));
       },
       StatusCode::kInvalidArgument, "key.shape[3] must equal query.shape[3] (8); was 4"},
      {"k/v length mismatch",
       [](auto* r) {
         *r->mutable_value() = MakeTensor(v1::DTYPE_FLOAT32, {2, 2, 6, 8}, std::vector<float>(192));
       },
       StatusCode::kInvalidArgument, "value.shape[2] must equal key.shape[2] (5); was 6"},
      {"Hq not a multiple of Hkv",
       [](auto* r) {
         *r->mutable_key() = MakeTensor(v1::DTYPE_FLOAT32, {2, 3, 5, 8}, std::vector<float>(240));
         *r->mutable_value() = MakeTensor(v1::DTYPE_FLOAT32, {2, 3, 5, 8}, std::vector<float>(240));
       },
       StatusCode::kInvalidArgument,
       "query.shape[1] (Hq = 4) must be a multiple of key.shape[1] (Hkv = 3)"},
      {"mask not broadcastable",
       [](auto* r) {
         *r->mutable_options()->mutable_mask() = MakeMask({2, 1, 1, 4}, std::vector<uint8_t>(8, 1));
       },
       StatusCode::kInvalidArgument,
       "options.mask shape [2, 1, 1, 4] is not broadcastable to [B, H, Lq, Lk] = [2, 4, 3, 5]"},
      {"mask not bool",
       [](auto* r) {
         *r->mutable_options()->mutable_mask() =
             MakeTensor(v1::DTYPE_FLOAT32, {5}, std::vector<float>(5, 1));
       },
       StatusCode::kInvalidArgument, "options.mask.dtype must be BOOL; was DTYPE_FLOAT32"},
      {"mask value 2",
       [](auto* r) {
         v1::Tensor m = MakeMask({5}, {1, 1, 1, 1, 1});
         (*m.mutable_data())[3] = 2;
         *r->mutable_options()->mutable_mask() = m;
       },
       StatusCode::kInvalidArgument, "element 3 was 2"},
      {"key_lengths count", [](auto* r) { r->mutable_options()->add_key_lengths(5); },
       StatusCode::kInvalidArgument,
       "options.key_lengths must be empty or hold B (2) entries; had 1"},
      {"key_lengths range",
       [](auto* r) {
         r->mutable_options()->add_key_lengths(5);
         r->mutable_options()->add_key_lengths(6);
       },
       StatusCode::kInvalidArgument, "options.key_lengths[1] must be in [0, Lk = 5]; was 6"},
      {"scale NaN", [](auto* r) { r->mutable_options()->set_scale(std::nanf("")); },
       StatusCode::kInvalidArgument, "options.scale must be finite; was nan"},
      {"window left below -1",
       [](auto* r) { r->mutable_options()->mutable_window()->set_left(-2); },
       StatusCode::kInvalidArgument, "options.window.left must be >= -1 (-1: open); was -2"},
      {"window right below -1",
       [](auto* r) { r->mutable_options()->mutable_window()->set_right(-7); },
       StatusCode::kInvalidArgument, "options.window.right must be >= -1 (-1: open); was -7"},
      {"softcap negative", [](auto* r) { r->mutable_options()->set_softcap(-1.5f); },
       StatusCode::kInvalidArgument, "options.softcap must be finite and >= 0; was -1.5"},
      {"softcap infinite", [](auto* r) { r->mutable_options()->set_softcap(INFINITY); },
       StatusCode::kInvalidArgument, "options.softcap must be finite and >= 0; was inf"},
      {"alibi empty", [](auto* r) { r->mutable_options()->mutable_alibi(); },
       StatusCode::kInvalidArgument,
       "options.alibi must hold either slopes (H = 4 entries) or standard: true; had 0 slopes and "
       "standard false"},
      {"alibi both",
       [](auto* r) {
         r->mutable_options()->mutable_alibi()->set_standard(true);
         for (int h = 0; h < 4; ++h) r->mutable_options()->mutable_alibi()->add_slopes(0.5f);
       },
       StatusCode::kInvalidArgument, "had 4 slopes and standard true"},
      {"alibi slope count",
       [](auto* r) { r->mutable_options()->mutable_alibi()->add_slopes(0.5f); },
       StatusCode::kInvalidArgument, "options.alibi.slopes must hold H (4) entries; had 1"},
      {"linear with a mask",
       [](auto* r) {
         r->mutable_options()->set_kind(v1::ATTENTION_KIND_LINEAR);
         *r->mutable_options()->mutable_mask() = MakeMask({5}, {1, 1, 1, 1, 1});
       },
       StatusCode::kInvalidArgument,
       "options.mask does not apply to kind ATTENTION_KIND_LINEAR (linear attention has no "
       "softmax over scores)"},
      {"linear with weights",
       [](auto* r) {
         r->mutable_options()->set_kind(v1::ATTENTION_KIND_LINEAR);
         r->mutable_options()->set_return_weights(true);
       },
       StatusCode::kInvalidArgument,
       "options.return_weights does not apply to kind ATTENTION_KIND_LINEAR"},
      {"feature map with softmax",
       [](auto* r) { r->mutable_options()->set_feature_map(v1::FEATURE_MAP_RELU); },
       StatusCode::kInvalidArgument,
       "options.feature_map applies to kind ATTENTION_KIND_LINEAR only; was FEATURE_MAP_RELU with "
       "softmax attention"},
      {"unknown kind",
       [](auto* r) { r->mutable_options()->set_kind(static_cast<v1::AttentionKind>(7)); },
       StatusCode::kInvalidArgument,
       "options.kind must be ATTENTION_KIND_SOFTMAX or ATTENTION_KIND_LINEAR (or unset); was 7"},
      {"unknown feature map",
       [](auto* r) {
         r->mutable_options()->set_kind(v1::ATTENTION_KIND_LINEAR);
         r->mutable_options()->set_feature_map(static_cast<v1::FeatureMap>(9));
       },
       StatusCode::kInvalidArgument, "options.feature_map must be one of"},
      {"alibi slope NaN",
       [](auto* r) {
         for (const float x : {0.5f, 0.25f, std::nanf(""), 0.1f}) {
           r->mutable_options()->mutable_alibi()->add_slopes(x);
         }
       },
       StatusCode::kInvalidArgument, "options.alibi.slopes[2] must be finite; was nan"},
      {"head dim over 256",
       [](auto* r) {
         *r->mutable_query() =
             MakeTensor(v1::DTYPE_FLOAT32, {1, 1, 1, 300}, std::vector<float>(300));
         *r->mutable_key() = MakeTensor(v1::DTYPE_FLOAT32, {1, 1, 1, 300}, std::vector<float>(300));
         *r->mutable_value() =
             MakeTensor(v1::DTYPE_FLOAT32, {1, 1, 1, 300}, std::vector<float>(300));
       },
       StatusCode::kInvalidArgument,
       "query.shape[3] (head dim D) is 300; the kernels support head dimensions up to 256"},
  };
  ASSERT_GE(std::size(cases), 15u);
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.name);
    v1::AttendRequest request = ValidAttend();
    c.mutate(&request);
    auto response = client_->Attend(request);
    ASSERT_FALSE(response.ok());
    EXPECT_EQ(response.status().code(), c.code) << response.status();
    EXPECT_THAT(response.status().message(), HasSubstr(c.message));
  }
  // Still serving.
  EXPECT_TRUE(client_->Attend(ValidAttend()).ok());
}

TEST_F(ServiceTest, MalformedMultiHeadRequestsGetClearErrors) {
  auto request = [](const std::string& module, std::vector<int64_t> shape) {
    v1::MultiHeadAttentionRequest r;
    r.set_module(module);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    *r.mutable_query() = MakeTensor(v1::DTYPE_FLOAT32, shape, std::vector<float>(n, 0.5f));
    return r;
  };
  auto unknown = client_->MultiHeadAttention(request("nope", {1, 2, 64}));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("module: no module 'nope'"));

  auto bad_name = client_->MultiHeadAttention(request("a b", {1, 2, 64}));
  EXPECT_EQ(bad_name.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_name.status().message(), HasSubstr("module may hold only"));

  auto width = client_->MultiHeadAttention(request("demo", {1, 2, 32}));
  EXPECT_EQ(width.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(width.status().message(),
              HasSubstr("query.shape[2] must equal the d_model of module 'demo' (64); was 32"));

  v1::MultiHeadAttentionRequest key_only = request("demo", {1, 2, 64});
  *key_only.mutable_key() = key_only.query();
  auto half = client_->MultiHeadAttention(key_only);
  EXPECT_EQ(half.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(half.status().message(), HasSubstr("value is required when key is given"));

  v1::MultiHeadAttentionRequest mask = request("demo", {1, 2, 64});
  *mask.mutable_options()->mutable_mask() = MakeMask({3, 2}, std::vector<uint8_t>(6, 1));
  auto bad_mask = client_->MultiHeadAttention(mask);
  EXPECT_THAT(bad_mask.status().message(), HasSubstr("[B, H, Lq, Lk] = [1, 4, 2, 2]"));

  EXPECT_TRUE(client_->MultiHeadAttention(request("demo", {1, 2, 64})).ok());
}

TEST_F(ServiceTest, MalformedLoadModuleRequestsGetClearErrors) {
  v1::LoadModuleRequest load;
  load.set_name("");
  EXPECT_THAT(client_->LoadModule(load).status().message(), HasSubstr("name must be 1 to 128"));
  load.set_name("ok");
  load.set_safetensors("garbage!!");
  auto garbage = client_->LoadModule(load);
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(garbage.status().message(), HasSubstr("safetensors"));
}

// Bad values far larger than any error message should be (issue 13): a client with gRPC's
// default 8 KiB metadata limit (client_ sets none) must see the real error, bounded, with the
// value elided in the middle.
TEST_F(ServiceTest, ErrorsAboutHugeValuesAreBoundedAndReachTheClient) {
  auto expect_bounded = [](const absl::Status& status, absl::StatusCode code,
                           const std::string& expected) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_THAT(status.message(), HasSubstr(expected));
    EXPECT_LE(status.message().size(), kMaxErrorMessageBytes);
  };
  const std::string huge_name(10'000, 'n');

  v1::UnloadModuleRequest unload;
  unload.set_name(huge_name);
  expect_bounded(client_->UnloadModule(unload).status(), absl::StatusCode::kInvalidArgument,
                 "name must be 1 to 128 characters long; was 10000 characters");

  v1::LoadModuleRequest load;
  load.set_name(huge_name);
  expect_bounded(client_->LoadModule(load).status(), absl::StatusCode::kInvalidArgument,
                 "name must be 1 to 128 characters long; was 10000 characters");

  v1::MultiHeadAttentionRequest mha;
  mha.set_module(huge_name);
  expect_bounded(client_->MultiHeadAttention(mha).status(), absl::StatusCode::kInvalidArgument,
                 "module must be 1 to 128 characters long; was 10000 characters");

  // A query with 3,000 dimensions: the shape is quoted with its middle elided.
  AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, 1, 1, 1, 2, 2, 4, 4, false, false);
  c.request.mutable_query()->clear_shape();
  for (int i = 0; i < 3000; ++i) c.request.mutable_query()->add_shape(1);
  const absl::Status rank = client_->Attend(c.request).status();
  expect_bounded(rank, absl::StatusCode::kInvalidArgument,
                 "query.shape must have 4 dimensions; was [1, 1, 1");
  EXPECT_THAT(rank.message(), HasSubstr(" bytes elided]..."));
  EXPECT_THAT(std::string(rank.message()), EndsWith(", 1, 1]"));

  // A 10 KB metadata value in a module file.
  const std::string header =
      R"({"__metadata__":{"num_heads":")" + std::string(10'000, '7') + R"(x"}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  load.set_name("huge-metadata");
  load.set_safetensors(file + header);
  const absl::Status metadata = client_->LoadModule(load).status();
  expect_bounded(metadata, absl::StatusCode::kInvalidArgument,
                 "safetensors metadata 'num_heads' must be a positive integer; was '7777");
  EXPECT_THAT(metadata.message(), HasSubstr(" bytes elided]...7777"));
  EXPECT_THAT(std::string(metadata.message()), EndsWith("7777x'"));

  // The server is still there and answers normally.
  EXPECT_TRUE(
      client_->Attend(MakeAttendCase(v1::DTYPE_FLOAT32, 1, 1, 1, 2, 2, 4, 4, false, false).request)
          .ok());
}

TEST_F(ServiceTest, LimitsAnswerResourceExhausted) {
  server::ServerOptions options;
  options.limits.max_sequence_length = 4;
  options.limits.max_tensor_elements = 1000;
  host_.reset();
  StartServer(options);
  AttendCase long_seq = MakeAttendCase(v1::DTYPE_FLOAT32, 1, 1, 1, 5, 2, 4, 4, false, false);
  auto r1 = client_->Attend(long_seq.request);
  EXPECT_EQ(r1.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r1.status().message(), HasSubstr("query.shape[2] (Lq) is 5; the server's limit "
                                               "(--max_sequence_length) is 4"));
  AttendCase big = MakeAttendCase(v1::DTYPE_FLOAT32, 20, 1, 1, 4, 4, 16, 16, false, false);
  auto r2 = client_->Attend(big.request);
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r2.status().message(), HasSubstr("--max_tensor_elements"));
}

// A backend without linear attention (as the CUDA backend was before its kernel): the reference for
// softmax attention, and a failure should a linear item ever reach it.
class NoLinearBackend final : public kernels::Backend {
 public:
  std::string name() const override { return "no-linear"; }
  std::vector<kernels::DeviceInfo> devices() const override { return inner_.devices(); }
  bool supports_linear_attention() const override { return false; }
  absl::Status Attend(absl::Span<const kernels::AttentionParams> batch) override {
    for (const kernels::AttentionParams& p : batch) {
      if (p.kind == kernels::AttentionKind::kLinear) return absl::InternalError("linear item");
    }
    return inner_.Attend(batch);
  }
  absl::Status MultiHead(absl::Span<const kernels::MultiHeadParams> batch) override {
    for (const kernels::MultiHeadParams& p : batch) {
      if (p.kind == kernels::AttentionKind::kLinear) return absl::InternalError("linear item");
    }
    return inner_.MultiHead(batch);
  }

 private:
  kernels::ReferenceBackend inner_;
};

// Linear attention on a server whose backend lacks it is computed by the CPU fallback: the same
// bits as a CPU server's (batch invariance), Timing.backend "cpu"; softmax attention stays on
// the server's backend.
TEST(ServerHostTest, LinearAttentionFallsBackToTheCpuWhereTheBackendLacksIt) {
  auto metrics = metrics::Metrics::Create({}).value();
  server::ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.backend_threads = 2;
  auto host =
      server::ServerHost::Start(options, std::make_unique<NoLinearBackend>(), metrics.get());
  ASSERT_TRUE(host.ok()) << host.status();
  options.backend = "cpu";
  auto cpu_host = server::ServerHost::Start(options, metrics.get());
  ASSERT_TRUE(cpu_host.ok()) << cpu_host.status();
  auto client = Client::Create("127.0.0.1:" + std::to_string((*host)->port())).value();
  auto cpu_client = Client::Create("127.0.0.1:" + std::to_string((*cpu_host)->port())).value();

  AttendCase c = MakeAttendCase(v1::DTYPE_FLOAT32, 2, 4, 2, 7, 9, 16, 8, true, false);
  v1::AttendRequest linear = c.request;
  linear.mutable_options()->set_kind(v1::ATTENTION_KIND_LINEAR);
  auto got = client->Attend(linear);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->timing().backend(), "cpu");
  auto want = cpu_client->Attend(linear);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(got->output().data(), want->output().data());

  auto softmax = client->Attend(c.request);
  ASSERT_TRUE(softmax.ok()) << softmax.status();
  EXPECT_EQ(softmax->timing().backend(), "no-linear");
  // GetServerInfo lists the CPU backend beside the active one.
  auto info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->backends_size(), 2);
  EXPECT_EQ(info->backends(0).name(), "no-linear");
  EXPECT_TRUE(info->backends(0).active());
  EXPECT_EQ(info->backends(1).name(), "cpu");
  EXPECT_FALSE(info->backends(1).active());
  EXPECT_LE(MaxAbsError(TensorToFloats(softmax->output()).value(), c.expected.out), 1e-5);
}

TEST(ParseModuleSpecTest, ParsesNamePathAndHeads) {
  auto a = server::ParseModuleSpec("bert=/m/bert.safetensors:12");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->name, "bert");
  EXPECT_EQ(a->path, "/m/bert.safetensors");
  EXPECT_EQ(a->num_heads, 12);
  auto b = server::ParseModuleSpec("x=/a:b/c.safetensors");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->path, "/a:b/c.safetensors");
  EXPECT_EQ(b->num_heads, 0);
  EXPECT_FALSE(server::ParseModuleSpec("no-equals").ok());
  EXPECT_FALSE(server::ParseModuleSpec("bad name=/x").ok());
}

TEST(ServerHostTest, StartupModulesLoadFromFilesAndBadFilesFailStartup) {
  server::ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.modules.push_back({"causal", testing::SeedVectorsDir() + "/causal.safetensors", 0});
  auto metrics = metrics::Metrics::Create({}).value();
  auto host = server::ServerHost::Start(options, metrics.get());
  ASSERT_TRUE(host.ok()) << host.status();
  auto m = (*host)->modules().Get("causal");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->weights.num_heads, 8);
  EXPECT_EQ((*m)->source, "file:" + testing::SeedVectorsDir() + "/causal.safetensors");

  options.modules = {{"x", "/nonexistent.safetensors", 0}};
  auto bad = server::ServerHost::Start(options, metrics.get());
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("/nonexistent.safetensors"));
}

}  // namespace
}  // namespace attnserve

namespace attnserve {
namespace {

using testing::MetricSample;

TEST_F(ServiceTest, EveryRequestIsCountedByRpcAndCode) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client_->Attend(ValidAttend()).ok());
  v1::AttendRequest bad = ValidAttend();
  bad.clear_value();
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(client_->Attend(bad).ok());
  ASSERT_TRUE(client_->ListModules().ok());
  const std::string text = metrics_->ExpositionText();
  EXPECT_EQ(MetricSample(text, "attnserve_requests_total", {"rpc=\"Attend\"", "code=\"OK\""}), 3);
  EXPECT_EQ(MetricSample(text, "attnserve_requests_total",
                         {"rpc=\"Attend\"", "code=\"INVALID_ARGUMENT\""}),
            2);
  EXPECT_EQ(MetricSample(text, "attnserve_requests_total", {"rpc=\"ListModules\"", "code=\"OK\""}),
            1);
  EXPECT_EQ(MetricSample(text, "attnserve_request_duration_seconds_count", {"rpc=\"Attend\""}), 5);
  EXPECT_EQ(MetricSample(text, "attnserve_batch_size_requests_count", {}),
            3);  // computed ones only
  EXPECT_GT(MetricSample(text, "attnserve_flops_total", {}), 0);
  EXPECT_EQ(MetricSample(text, "attnserve_requests_in_flight", {}), 0);
  // The demo module's float32 weights: 4 matrices of 64x64 and 4 biases of 64.
  EXPECT_EQ(MetricSample(text, "attnserve_module_bytes", {}), 4 * (4 * 64 * 64 + 4 * 64));
}

}  // namespace
}  // namespace attnserve

namespace attnserve::server {
namespace {

// SerializeResponse writes a float32 output without copying it into the message; a parser must
// read the same message as FillResponse builds, output, weights and timing alike.
template <typename Response>
void ExpectSerializeResponseMatchesFillResponse(bool with_weights) {
  auto make_job = [&] {
    auto job = std::make_unique<Job>();
    job->dtype = kernels::DType::kFloat32;
    job->out_shape = {2, 3, 5};
    for (int i = 0; i < 30; ++i) job->out.push_back(0.25f * static_cast<float>(i) - 3.0f);
    if (with_weights) {
      job->weights_shape = {2, 3};
      job->weights = {0.5f, 0.25f, 0.125f, 1.0f, 0.0f, -2.0f};
    }
    job->timing.arrival = absl::FromUnixSeconds(100);
    job->timing.compute_start = job->timing.arrival + absl::Microseconds(7);
    job->timing.compute_end = job->timing.arrival + absl::Microseconds(19);
    job->timing.batch_size = 3;
    job->timing.backend = "cpu";
    return job;
  };
  const absl::Time now = absl::FromUnixSeconds(100) + absl::Microseconds(40);
  Response expected;
  FillResponse(*make_job(), now, &expected);
  ASSERT_EQ(expected.output().data().size(), 30 * sizeof(float));

  auto job = make_job();
  grpc::ByteBuffer bytes;
  SerializeResponse<Response>(job.get(), now, &bytes);
  EXPECT_TRUE(job->out.empty()) << "the output buffer moved into the message";
  Response got;
  ASSERT_TRUE(ParseMessage(bytes, &got));
  EXPECT_EQ(got.DebugString(), expected.DebugString());
  EXPECT_EQ(bytes.Length(), expected.ByteSizeLong());
}

TEST(SerializeResponseTest, AttendResponseParsesAsFillResponsesMessage) {
  ExpectSerializeResponseMatchesFillResponse<v1::AttendResponse>(/*with_weights=*/false);
  ExpectSerializeResponseMatchesFillResponse<v1::AttendResponse>(/*with_weights=*/true);
}

TEST(SerializeResponseTest, MultiHeadResponseParsesAsFillResponsesMessage) {
  ExpectSerializeResponseMatchesFillResponse<v1::MultiHeadAttentionResponse>(false);
  ExpectSerializeResponseMatchesFillResponse<v1::MultiHeadAttentionResponse>(true);
}

}  // namespace
}  // namespace attnserve::server
