// The elementwise kernels of elementwise.cu (ConvertFromFloat, ValueMean, AddBias) on the host
// emulation, through the file's own launch code (host_cu.sh), against values computed here.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/flash_fwd.h"
#include "tests/cuda_emu/emu.h"

namespace attnserve::kernels::cuda {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint16_t Bits16(float f, ComputeType type) {
  return type == ComputeType::kFloat16 ? __float2half_rn(f).x : __float2bfloat16_rn(f).x;
}

// Round to nearest even in both types, NaN and infinities kept, values past fp16's range to
// infinity; every element of an odd count (a partial last block).
TEST(ElementwiseEmuTest, ConvertFromFloatRoundsEveryElement) {
  for (ComputeType type : {ComputeType::kFloat16, ComputeType::kBFloat16}) {
    const int64_t n = 1000;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> dist(-3, 3);
    std::unique_ptr<float[]> src(new float[n]);
    for (int64_t i = 0; i < n; ++i) src[i] = dist(rng);
    src[1] = kNaN;
    src[2] = std::numeric_limits<float>::infinity();
    src[3] = 1e6f;             // past fp16's largest finite value
    src[4] = 1.0f + 0x1p-11f;  // halfway between two fp16 values: rounds to even (1.0)
    src[5] = 1.0f + 0x1p-8f;   // halfway between two bf16 values: rounds to even (1.0)
    std::unique_ptr<uint16_t[]> dst(new uint16_t[n]);
    ASSERT_TRUE(ConvertFromFloat(src.get(), dst.get(), n, type, nullptr).ok());
    for (int64_t i = 0; i < n; ++i) {
      if (i == 1) continue;
      EXPECT_EQ(dst[i], Bits16(src[i], type)) << ComputeTypeName(type) << " element " << i;
    }
    const float back = type == ComputeType::kFloat16 ? __half2float(__half{dst[1]})
                                                     : __bfloat162float(__nv_bfloat16{dst[1]});
    EXPECT_TRUE(std::isnan(back));
    EXPECT_EQ(dst[4], Bits16(1.0f, type));  // a tie in fp16, below one in bf16
    if (type == ComputeType::kBFloat16) {
      EXPECT_EQ(dst[5], Bits16(1.0f, type));
    }
  }
  EXPECT_TRUE(ConvertFromFloat(nullptr, nullptr, 0, ComputeType::kFloat16, nullptr).ok());
}

// Past 65535 blocks of 256 threads the grid stays at 65535 blocks and each thread strides over
// the rest: blocks 0 and 65534 are emulated (all of them would be 16.7 M host threads); block 0
// converts its elements of both passes, block 65534 its first-pass ones, and the elements of
// the blocks not emulated stay unwritten.
TEST(ElementwiseEmuTest, ConvertFromFloatGridStride) {
  const int64_t grid_elems = int64_t{65535} * 256;
  const int64_t n = grid_elems + 300;
  std::unique_ptr<float[]> src(new float[n]);
  for (int64_t i = 0; i < n; ++i) src[i] = static_cast<float>(i % 1000) * 0.25f + 1;
  std::unique_ptr<uint16_t[]> dst(new uint16_t[n]);
  std::memset(dst.get(), 0, n * sizeof(uint16_t));
  emu::SetBlockFilter([](const uint3& b) { return b.x == 0 || b.x == 65534; });
  const GpuStatus st = ConvertFromFloat(src.get(), dst.get(), n, ComputeType::kFloat16, nullptr);
  emu::SetBlockFilter(nullptr);
  ASSERT_TRUE(st.ok()) << st.error;
  const int64_t last_block = int64_t{65534} * 256;
  for (int64_t begin : {int64_t{0}, last_block, grid_elems}) {
    for (int64_t i = begin; i < begin + 256; ++i) {
      ASSERT_EQ(dst[i], Bits16(src[i], ComputeType::kFloat16)) << i;
    }
  }
  EXPECT_EQ(dst[256], 0);               // block 1, first pass
  EXPECT_EQ(dst[last_block - 1], 0);    // block 65533
  EXPECT_EQ(dst[grid_elems + 256], 0);  // block 1, second pass
}

// v_mean[s, g, c]: the mean over the sequence's keys of a strided float32 v (padding between
// heads and rows), summed in key order (bitwise the float loop here), 0 for a sequence with no
// keys; Dv = 72 spans two column blocks of 64, the second partial.
TEST(ElementwiseEmuTest, ValueMeanPerSequenceHeadAndColumn) {
  const int S = 3, Hkv = 2, Dv = 72;
  const int64_t head_stride = 80, row_stride = Hkv * head_stride + 8;
  const std::vector<int> cu_k = {0, 37, 37, 40};  // lengths 37, 0, 3
  const int total = cu_k.back();
  std::unique_ptr<float[]> v(new float[total * row_stride]);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int64_t i = 0; i < total * row_stride; ++i) v[i] = dist(rng);
  std::unique_ptr<int[]> cu(new int[S + 1]);
  std::copy(cu_k.begin(), cu_k.end(), cu.get());
  std::unique_ptr<float[]> mean(new float[S * Hkv * Dv]);
  std::fill(mean.get(), mean.get() + S * Hkv * Dv, kNaN);
  ASSERT_TRUE(
      ValueMean(v.get(), row_stride, head_stride, cu.get(), S, Hkv, Dv, mean.get(), nullptr).ok());
  for (int s = 0; s < S; ++s) {
    for (int g = 0; g < Hkv; ++g) {
      for (int c = 0; c < Dv; ++c) {
        float sum = 0;
        const int len = cu_k[s + 1] - cu_k[s];
        for (int t = cu_k[s]; t < cu_k[s + 1]; ++t) sum += v[t * row_stride + g * head_stride + c];
        const float want = len > 0 ? sum / len : 0.0f;
        EXPECT_EQ(mean[(s * Hkv + g) * Dv + c], want) << s << " " << g << " " << c;
      }
    }
  }
}

// y[r, c] += bias[c] over every element of a row-major [rows, cols] y.
TEST(ElementwiseEmuTest, AddBiasEveryRow) {
  const int rows = 7, cols = 45;
  std::vector<float> y(rows * cols), bias(cols);
  for (int i = 0; i < rows * cols; ++i) y[i] = static_cast<float>(i);
  for (int c = 0; c < cols; ++c) bias[c] = 0.5f * c - 3;
  std::unique_ptr<float[]> dy(new float[rows * cols]);
  std::unique_ptr<float[]> db(new float[cols]);
  std::copy(y.begin(), y.end(), dy.get());
  std::copy(bias.begin(), bias.end(), db.get());
  ASSERT_TRUE(AddBias(dy.get(), db.get(), rows, cols, nullptr).ok());
  for (int i = 0; i < rows * cols; ++i) EXPECT_EQ(dy[i], y[i] + bias[i % cols]) << i;
  EXPECT_TRUE(AddBias(nullptr, nullptr, 0, cols, nullptr).ok());
}

}  // namespace
}  // namespace attnserve::kernels::cuda
