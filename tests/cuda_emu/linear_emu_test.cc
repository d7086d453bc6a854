// linear.cc's LinearForward (y = x W^T + b, nn.Linear) on the host emulation: its cuBLASLt
// path with the bias epilogue, and its fallback (cublasGemmEx plus elementwise.cu's bias
// kernel, emulated) when cuBLASLt offers no algorithm, through shim/cublasLt.h and
// shim/cublas_v2.h (emu_blas.cc), against float64.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/linear.h"

namespace attnserve::kernels::cuda {
namespace {

struct Linear {
  int64_t rows;
  int in, out;
  bool bias;
};

// Runs LinearForward on exact-size buffers (y NaN-filled) and compares with float64; float32
// inputs and a float32 result: within 1e-5 on these magnitudes (the device's TF32 inputs are
// not emulated, see cublasLt.h).
void CheckLinear(const Linear& s) {
  std::mt19937 rng(static_cast<uint32_t>(s.rows * 131 + s.in * 7 + s.out));
  std::uniform_real_distribution<float> dist(-1, 1);
  auto fill = [&](size_t n) {
    std::unique_ptr<float[]> p(new float[n]);
    for (size_t i = 0; i < n; ++i) p[i] = dist(rng);
    return p;
  };
  const auto x = fill(size_t(s.rows) * s.in);
  const auto w = fill(size_t(s.out) * s.in);
  const auto b = fill(s.out);
  std::unique_ptr<float[]> y(new float[size_t(s.rows) * s.out]);
  std::fill(y.get(), y.get() + s.rows * s.out, std::numeric_limits<float>::quiet_NaN());
  LinearArgs a;
  a.x = x.get();
  a.w = w.get();
  a.bias = s.bias ? b.get() : nullptr;
  a.y = y.get();
  a.rows = s.rows;
  a.in_features = s.in;
  a.out_features = s.out;
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  std::unique_ptr<unsigned char[]> workspace(new unsigned char[1024]);
  const GpuStatus st = LinearForward(a, lt, blas, workspace.get(), 1024, nullptr);
  cublasDestroy(blas);
  cublasLtDestroy(lt);
  ASSERT_TRUE(st.ok()) << st.error;
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int o = 0; o < s.out; ++o) {
      double want = s.bias ? b[o] : 0.0;
      for (int i = 0; i < s.in; ++i) want += double{x[r * s.in + i]} * w[size_t(o) * s.in + i];
      EXPECT_NEAR(y[r * s.out + o], want, 1e-5) << "row " << r << " output " << o;
    }
  }
}

const Linear kShapes[] = {{5, 7, 3, true}, {1, 64, 48, true}, {9, 33, 17, false}};

// The cuBLASLt path: one matmul with the bias in its epilogue.
TEST(LinearEmuTest, CublasLtWithBiasEpilogue) {
  for (const Linear& s : kShapes) {
    const int before = emu::LtMatmulCount();
    CheckLinear(s);
    EXPECT_EQ(emu::LtMatmulCount(), before + 1) << "the cuBLASLt path was not taken";
  }
}

// No cuBLASLt algorithm: cublasGemmEx, then AddBias (elementwise.cu) on the emulator.
TEST(LinearEmuTest, FallbackWithoutCublasLtAlgorithm) {
  emu::SetLtAlgorithmsAvailable(false);
  for (const Linear& s : kShapes) {
    const int before = emu::LtMatmulCount();
    CheckLinear(s);
    EXPECT_EQ(emu::LtMatmulCount(), before) << "cuBLASLt ran despite offering no algorithm";
  }
  emu::SetLtAlgorithmsAvailable(true);
}

// No rows: nothing to compute, success.
TEST(LinearEmuTest, NoRows) {
  LinearArgs a;
  a.in_features = 4;
  a.out_features = 3;
  EXPECT_TRUE(LinearForward(a, nullptr, nullptr, nullptr, 0, nullptr).ok());
}

}  // namespace
}  // namespace attnserve::kernels::cuda
