// The launch code of the fused forward (flash_fwd_launch_template.h, the flash_fwd_*.cu
// instantiations, flash_fwd_dispatch.cc's FlashForward) and of the decode path
// (flash_decode.cu's FlashDecode) run on the host emulation through the
// CUDA runtime shim (shim/cuda_runtime_api.h): host_cu.sh rewrites the .cu files' launches into
// emulator calls, so these are the real files' grid, block, shared-memory and attribute code.
// Checked against the float64 reference; the kernels' own cases are flash_emu_test's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/cuda/flash_fwd.h"
#include "kernels/cuda/kernel_traits.h"
#include "kernels/reference.h"

namespace attnserve::kernels::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// One sequence of q_len x kv_len, num_heads query heads on num_kv_heads, fp16, optionally
// causal and with a per-head random mask placed `mask_shift` bytes into its buffer (0: 16-byte
// aligned); through FlashForward, or FlashDecode when `decode`.
struct Shape {
  int q_len = 37;
  int kv_len = 81;
  int num_heads = 2;
  int num_kv_heads = 2;
  bool decode = false;
  int head_dim = 64;
  int v_head_dim = 64;
  bool causal = false;
  bool mask = false;
  int mask_shift = 0;
};

struct Result {
  GpuStatus status;
  FlashPath path = FlashPath::kUnsupported;
  double max_error = 0;  // over every output element, against the float64 reference
};

uint16_t Half(float f, float* rounded) {
  const __half h = __float2half_rn(f);
  *rounded = __half2float(h);
  return h.x;
}

Result Forward(const Shape& s) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int H = s.num_heads, Hkv = s.num_kv_heads, D = s.head_dim, Dv = s.v_head_dim;
  auto fill = [&](size_t n, std::unique_ptr<uint16_t[]>& bits, std::vector<float>& values) {
    bits.reset(new uint16_t[n]);
    values.resize(n);
    for (size_t i = 0; i < n; ++i) bits[i] = Half(dist(rng), &values[i]);
  };
  std::unique_ptr<uint16_t[]> q, k, v;
  std::vector<float> qf, kf, vf;
  fill(size_t(s.q_len) * H * D, q, qf);
  fill(size_t(s.kv_len) * Hkv * D, k, kf);
  fill(size_t(s.kv_len) * Hkv * Dv, v, vf);
  const size_t mask_n = size_t(H) * s.q_len * s.kv_len;
  std::unique_ptr<uint8_t[]> mask_buffer(new uint8_t[mask_n + s.mask_shift]);
  uint8_t* mask = mask_buffer.get() + s.mask_shift;
  std::bernoulli_distribution allow(0.7);
  for (size_t i = 0; i < mask_n; ++i) mask[i] = allow(rng) ? 1 : 0;
  // v_mean for rows with no allowed key, as the backend computes it.
  std::unique_ptr<float[]> v_mean(new float[size_t(Hkv) * Dv]);
  for (int h = 0; h < Hkv; ++h) {
    for (int d = 0; d < Dv; ++d) {
      double sum = 0;
      for (int t = 0; t < s.kv_len; ++t) sum += vf[(size_t(t) * Hkv + h) * Dv + d];
      v_mean[size_t(h) * Dv + d] = static_cast<float>(sum / s.kv_len);
    }
  }
  const int cu_q[2] = {0, s.q_len}, cu_k[2] = {0, s.kv_len};
  std::unique_ptr<float[]> o(new float[size_t(s.q_len) * H * Dv]);

  FlashFwdParams p;
  p.q = q.get();
  p.k = k.get();
  p.v = v.get();
  p.q_row_stride = int64_t{H} * D;
  p.k_row_stride = int64_t{Hkv} * D;
  p.q_head_stride = p.k_head_stride = D;
  p.v_row_stride = int64_t{Hkv} * Dv;
  p.o_row_stride = int64_t{H} * Dv;
  p.v_head_stride = p.o_head_stride = Dv;
  p.o = o.get();
  p.cu_seqlens_q = cu_q;
  p.cu_seqlens_k = cu_k;
  p.num_seqs = 1;
  p.max_seqlen_q = s.q_len;
  p.num_heads = H;
  p.num_kv_heads = Hkv;
  p.head_dim = D;
  p.v_head_dim = Dv;
  p.scale = 1.0f / std::sqrt(static_cast<float>(D));
  p.scale_log2 = p.scale * kLog2e;
  p.causal = s.causal;
  if (s.mask) {
    p.mask = mask;
    p.mask_head_stride = int64_t{s.q_len} * s.kv_len;
    p.mask_row_stride = s.kv_len;
    p.mask_col_stride = 1;
  }
  p.v_mean = v_mean.get();

  Result run;
  run.path = SelectFlashPath(p);
  if (s.decode) {
    // Exactly the size the launch code asks for, NaN-filled: a slot past it is an overrun
    // (ASan), one read before it is written shows as NaN.
    const size_t floats = FlashDecodeWorkspaceBytes(p, s.kv_len) / sizeof(float);
    std::unique_ptr<float[]> workspace(new float[floats]);
    std::fill(workspace.get(), workspace.get() + floats, std::nanf(""));
    run.status = FlashDecode(p, ComputeType::kFloat16, s.kv_len, workspace.get(), nullptr);
  } else {
    run.status = FlashForward(p, ComputeType::kFloat16, /*stream=*/nullptr);
  }
  if (!run.status.ok()) return run;

  AttentionParams a;
  a.batch = 1;
  a.num_heads = H;
  a.num_kv_heads = Hkv;
  a.q_len = s.q_len;
  a.kv_len = s.kv_len;
  a.head_dim = D;
  a.v_head_dim = Dv;
  a.q = {qf.data(), 0, D, int64_t{H} * D};
  a.k = {kf.data(), 0, D, int64_t{Hkv} * D};
  a.v = {vf.data(), 0, Dv, int64_t{Hkv} * Dv};
  if (s.mask) a.mask = {mask, 0, p.mask_head_stride, p.mask_row_stride, 1};
  a.causal = s.causal;
  a.scale = p.scale;
  const Reference64 ref = ReferenceAttention64(a);
  for (int h = 0; h < H; ++h) {
    for (int i = 0; i < s.q_len; ++i) {
      for (int d = 0; d < Dv; ++d) {
        const double want = ref.out[(size_t(h) * s.q_len + i) * Dv + d];
        const double got = o[(size_t(i) * H + h) * Dv + d];
        run.max_error = std::max(run.max_error, std::isnan(got) ? 1e9 : std::fabs(got - want));
      }
    }
  }
  return run;
}

// Tensor cores, P rounded to fp16 (flash_emu_test.cc: Tolerance); the generic kernel keeps P
// in float32.
constexpr double kTensorCoreTolerance = 2e-3;
constexpr double kGenericTolerance = 2e-5;

TEST(FlashLaunchEmuTest, TensorCoreAboveDefaultSharedMemory) {
  // hdim 64 and 128 need more than 48 KiB of shared memory: the launch code must raise the
  // kernel's limit first, else the emulated launch fails as CUDA's would.
  for (const int d : {64, 128}) {
    Shape s;
    s.head_dim = s.v_head_dim = d;
    s.causal = true;
    s.mask = true;
    const int smem = d == 64 ? FlashFwdTraitsHdim<64, ComputeType::kFloat16>::kSmemBytes
                             : FlashFwdTraitsHdim<128, ComputeType::kFloat16>::kSmemBytes;
    ASSERT_GT(smem, 48 * 1024);
    const Result r = Forward(s);
    ASSERT_TRUE(r.status.ok()) << r.status.error;
    EXPECT_EQ(r.path, FlashPath::kTensorCore);
    EXPECT_LE(r.max_error, kTensorCoreTolerance) << "hdim " << d;
  }
}

TEST(FlashLaunchEmuTest, TensorCorePaddedHeadDims) {
  Shape s;
  s.head_dim = 24;
  s.v_head_dim = 32;  // hdim 32, under 48 KiB
  const Result r = Forward(s);
  ASSERT_TRUE(r.status.ok()) << r.status.error;
  EXPECT_EQ(r.path, FlashPath::kTensorCore);
  EXPECT_LE(r.max_error, kTensorCoreTolerance);
}

TEST(FlashLaunchEmuTest, GenericForOtherHeadDimsAndUnalignedMasks) {
  Shape s;
  s.head_dim = 36;  // not multiples of 8
  s.v_head_dim = 44;
  s.mask = true;
  Result r = Forward(s);
  ASSERT_TRUE(r.status.ok()) << r.status.error;
  EXPECT_EQ(r.path, FlashPath::kGeneric);
  EXPECT_LE(r.max_error, kGenericTolerance);
  // A mask the tensor-core kernel cannot copy in aligned words takes the generic kernel.
  s = Shape{};
  s.mask = true;
  s.mask_shift = 1;
  r = Forward(s);
  ASSERT_TRUE(r.status.ok()) << r.status.error;
  EXPECT_EQ(r.path, FlashPath::kGeneric);
  EXPECT_LE(r.max_error, kGenericTolerance);
}

TEST(FlashLaunchEmuTest, DecodeSplitsAndGroups) {
  // flash_decode.cu: 700 keys in several fixed-size splits, GQA 4/1 and 8/2 with a mask, and
  // the combine kernel; P stays in float32 (the generic tolerance).
  for (const auto& [h, hkv] : {std::pair{4, 1}, std::pair{8, 2}}) {
    Shape s;
    s.decode = true;
    s.q_len = 1;
    s.kv_len = 700;
    s.num_heads = h;
    s.num_kv_heads = hkv;
    s.v_head_dim = 72;
    s.mask = true;
    const Result r = Forward(s);
    ASSERT_TRUE(r.status.ok()) << r.status.error;
    EXPECT_LE(r.max_error, kGenericTolerance) << h << "/" << hkv;
  }
}

TEST(FlashLaunchEmuTest, UnsupportedHeadDimIsAnError) {
  Shape s;
  s.q_len = 2;
  s.kv_len = 3;
  s.head_dim = 64;
  s.v_head_dim = 264;
  const Result r = Forward(s);
  EXPECT_EQ(r.path, FlashPath::kUnsupported);
  EXPECT_NE(r.status.error.find("v_head_dim 264"), std::string::npos) << r.status.error;
}

}  // namespace
}  // namespace attnserve::kernels::cuda
