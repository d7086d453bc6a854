// Kernel sweep of the fused attention forward (kernels/cuda/flash_fwd.h) against the cuBLAS
// naive attention in the same operand type, on device buffers, sized to fit the 5-minute GPU
// check (run_h200.sh has the arithmetic). CUDA and cuBLAS only (no gRPC, no Abseil).
//
//   flash_bench [--out=FILE] [--budget_s=S]   the sweep; one JSON line per shape, appended and
//                                             flushed as each finishes (a killed run keeps every
//                                             finished shape); no new shape starts after S
//                                             seconds (default 100)
//   flash_bench --smoke                       every kernel path once on a small problem (masks,
//                                             key lengths, causal, GQA, generic, naive, decode,
//                                             linear attention), for compute-sanitizer memcheck
//                                             and racecheck
//
// Inputs are generated once, on the device (a hash of the index, uniform with variance 1), at
// the largest shape, and every shape reads a prefix: no host random numbers, no per-shape
// uploads. Each shape runs 1 warm-up and a FIXED number of timed calls (kFlashIters, kNaiveIters),
// each timed with its own CUDA events; the line records the median and the minimum.
// Shapes: B * L = kTokens tokens, 16 heads; FLOPs 4 * B * H * L^2 * d, halved for causal.
// Names: "<impl>/<dtype>/d<dim>/causal<0|1>/L<len>" (sdpa_compare.py parses them). After the
// sweep, a decode step and linear attention's kernel (their own names; sdpa_compare skips them).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/flash_fwd.h"
#include "kernels/cuda/linear_attention.h"

namespace attnserve::kernels::cuda {
namespace {

constexpr int kTokens = 4096;
constexpr int kHeads = 16;
constexpr int kMaxDim = 256;
constexpr int kFlashIters = 3;  // timed calls per shape (after one warm-up)
constexpr int kNaiveIters = 3;

// Uniform in [-sqrt(3), sqrt(3)) (variance 1) from a hash of (index, seed), stored as float.
__global__ void FillKernel(float* x, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    x[i] = (static_cast<float>(h >> 8) * (1.0f / 16777216.0f) - 0.5f) * 3.4641016f;
  }
}

struct Fail {
  std::string what;
};
void Check(const GpuStatus& s) {
  if (!s.ok()) throw Fail{s.error};
}
void CheckCuda(cudaError_t e, const char* what) { Check(CudaCheck(e, what)); }

// `run` once to warm up, then `iters` timed calls, each between its own CUDA events: their times
// in ms, sorted.
template <class Run>
std::vector<double> TimeCalls(int iters, Run run) {
  run();
  CheckCuda(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(start);
    run();
    cudaEventRecord(stop);
    CheckCuda(cudaEventSynchronize(stop), "timed call");
    float t = 0.0f;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms;
}

struct Operands {
  void* q = nullptr;
  void* k = nullptr;
  void* v = nullptr;
};

// q, k, v of kTokens x kHeads x kMaxDim in `type`, generated on the device.
Operands MakeOperands(ComputeType type, float* scratch) {
  const int64_t n = int64_t{kTokens} * kHeads * kMaxDim;
  Operands o;
  void** dst[3] = {&o.q, &o.k, &o.v};
  for (int t = 0; t < 3; ++t) {
    FillKernel<<<1024, 256>>>(scratch, n, 1234u + 77u * t + (type == ComputeType::kFloat16));
    CheckCuda(cudaGetLastError(), "fill");
    CheckCuda(cudaMalloc(dst[t], n * 2), "cudaMalloc operand");
    Check(ConvertFromFloat(scratch, *dst[t], n, type, nullptr));
  }
  CheckCuda(cudaDeviceSynchronize(), "generating inputs");
  return o;
}

struct Shape {
  bool naive;
  ComputeType type;
  int d;
  bool causal;
  int len;
  int iters;
  int window_left = -1;  // a causal sliding window of window_left + 1 keys (the kMods kernel)
};

std::string Name(const Shape& s) {
  return std::string(s.naive ? "naive" : "flash") + "/" +
         (s.type == ComputeType::kFloat16 ? "fp16" : "bf16") + "/d" + std::to_string(s.d) +
         "/causal" + (s.causal ? "1" : "0") + "/L" + std::to_string(s.len) +
         (s.window_left >= 0 ? "/window" + std::to_string(s.window_left) : "");
}

// The FLOPs of the scores each row attends to (a causal row i: i + 1 keys, or the window's).
double Flops(const Shape& s) {
  const double batch = kTokens / s.len;
  if (s.window_left < 0) {
    return 4.0 * batch * kHeads * double(s.len) * s.len * s.d / (s.causal ? 2.0 : 1.0);
  }
  double keys = 0;
  for (int i = 0; i < s.len; ++i) keys += std::min(i, s.window_left) + 1;
  return 4.0 * batch * kHeads * keys * s.d;
}

// One shape: 1 warm-up and s.iters timed calls. Appends a JSON line to `out`.
void RunShape(const Shape& s, const Operands& ops, float* o, cublasHandle_t blas, FILE* out) {
  const int batch = kTokens / s.len;
  std::vector<int> cu_host(batch + 1);
  for (int b = 0; b <= batch; ++b) cu_host[b] = b * s.len;
  int* cu = nullptr;
  CheckCuda(cudaMalloc(&cu, cu_host.size() * sizeof(int)), "cudaMalloc cu_seqlens");
  CheckCuda(cudaMemcpy(cu, cu_host.data(), cu_host.size() * sizeof(int), cudaMemcpyHostToDevice),
            "copy cu_seqlens");
  FlashFwdParams p;
  p.q = ops.q;
  p.k = ops.k;
  p.v = ops.v;
  p.o = o;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = int64_t{kHeads} * s.d;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = s.d;
  p.cu_seqlens_q = p.cu_seqlens_k = cu;
  p.num_seqs = batch;
  p.max_seqlen_q = s.len;
  p.num_heads = p.num_kv_heads = kHeads;
  p.head_dim = p.v_head_dim = s.d;
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  p.scale_log2 = p.scale * 1.4426950408889634f;
  p.causal = s.causal;
  p.window.left = s.window_left;
  void* ws = nullptr;
  if (s.naive) {
    CheckCuda(cudaMalloc(&ws, NaiveAttentionWorkspaceBytes(p, cu_host.data(), cu_host.data())),
              "cudaMalloc naive workspace");
  }
  auto run = [&] {
    Check(s.naive ? NaiveAttentionForward(p, s.type, cu_host.data(), cu_host.data(), nullptr,
                                          nullptr, ws, blas, nullptr)
                  : FlashForward(p, s.type, nullptr));
  };
  const std::vector<double> ms = TimeCalls(s.iters, run);
  cudaFree(cu);
  if (ws != nullptr) cudaFree(ws);
  const double median = ms[ms.size() / 2];
  const double tflops = Flops(s) / (median / 1e3) / 1e12;
  std::fprintf(out,
               "{\"name\": \"%s\", \"kernel\": \"%s\", \"B\": %d, \"H\": %d, \"iters\": %d, "
               "\"median_ms\": %.4f, \"min_ms\": %.4f, \"TFLOPS\": %.2f}\n",
               Name(s).c_str(), s.naive ? "cublas-naive" : FlashPathName(SelectFlashPath(p)), batch,
               kHeads, s.iters, median, ms.front(), tflops);
  std::fflush(out);
  std::printf("%-32s %9.3f ms  %7.1f TFLOP/s\n", Name(s).c_str(), median, tflops);
  std::fflush(stdout);
}

// A decode step: kDecodeSeqs sequences of one query token over 4096 keys each, 8 query heads on
// 1 kv head (GQA 8), d = 128, fp16: the fused kernel (one block per query head, 1 of 64 rows
// used) against the decode path (flash_decode_kernel.h). Memory-bound: the figure is the K and V
// bytes read (each once) per second. 1 warm-up + kDecodeIters timed calls.
constexpr int kDecodeSeqs = 16;
constexpr int kDecodeIters = 10;
void RunDecodeShape(bool decode, const Operands& ops, float* o, FILE* out) {
  constexpr int kLen = 4096, kGroup = 8, kD = 128;
  std::vector<int> cu_q(kDecodeSeqs + 1), cu_k(kDecodeSeqs + 1);
  for (int b = 0; b <= kDecodeSeqs; ++b) {
    cu_q[b] = b;
    cu_k[b] = b * kLen;
  }
  int *dq = nullptr, *dk = nullptr;
  CheckCuda(cudaMalloc(&dq, cu_q.size() * sizeof(int)), "cudaMalloc cu_seqlens");
  CheckCuda(cudaMalloc(&dk, cu_k.size() * sizeof(int)), "cudaMalloc cu_seqlens");
  CheckCuda(cudaMemcpy(dq, cu_q.data(), cu_q.size() * sizeof(int), cudaMemcpyHostToDevice), "copy");
  CheckCuda(cudaMemcpy(dk, cu_k.data(), cu_k.size() * sizeof(int), cudaMemcpyHostToDevice), "copy");
  FlashFwdParams p;
  p.q = ops.q;
  p.k = ops.k;
  p.v = ops.v;
  p.o = o;
  p.q_row_stride = p.o_row_stride = int64_t{kGroup} * kD;
  p.k_row_stride = p.v_row_stride = kD;
  p.q_head_stride = p.o_head_stride = kD;
  p.k_head_stride = p.v_head_stride = kD;
  p.cu_seqlens_q = dq;
  p.cu_seqlens_k = dk;
  p.num_seqs = kDecodeSeqs;
  p.max_seqlen_q = 1;
  p.num_heads = kGroup;
  p.num_kv_heads = 1;
  p.head_dim = p.v_head_dim = kD;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kD));
  p.scale_log2 = p.scale * 1.4426950408889634f;
  void* ws = nullptr;
  if (decode) {
    CheckCuda(cudaMalloc(&ws, FlashDecodeWorkspaceBytes(p, kLen)), "cudaMalloc decode workspace");
  }
  auto run = [&] {
    Check(decode ? FlashDecode(p, ComputeType::kFloat16, kLen, ws, nullptr)
                 : FlashForward(p, ComputeType::kFloat16, nullptr));
  };
  const std::vector<double> ms = TimeCalls(kDecodeIters, run);
  cudaFree(dq);
  cudaFree(dk);
  if (ws != nullptr) cudaFree(ws);
  const double median = ms[ms.size() / 2];
  const double bytes = 2.0 * kDecodeSeqs * kLen * kD * 2;  // K and V, fp16, one kv head
  const std::string name = std::string(decode ? "decode" : "fused") + "/fp16/d128/gqa8/L4096";
  std::fprintf(out,
               "{\"name\": \"%s\", \"B\": %d, \"H\": %d, \"iters\": %d, \"median_ms\": %.4f, "
               "\"min_ms\": %.4f, \"kv_GBps\": %.1f}\n",
               name.c_str(), kDecodeSeqs, kGroup, kDecodeIters, median, ms.front(),
               bytes / (median / 1e3) / 1e9);
  std::fflush(out);
  std::printf("%-32s %9.4f ms  %7.1f GB/s of K and V\n", name.c_str(), median,
              bytes / (median / 1e3) / 1e9);
  std::fflush(stdout);
}

// Linear attention's operands: q, k, v of kLinearElems float32 each (its kernel's only operand
// type), generated on the device like the others.
constexpr int64_t kLinearElems = int64_t{kTokens} * kHeads * 64;
struct LinearOperands {
  float* q = nullptr;
  float* k = nullptr;
  float* v = nullptr;
};
LinearOperands MakeLinearOperands() {
  LinearOperands o;
  float** dst[3] = {&o.q, &o.k, &o.v};
  for (int t = 0; t < 3; ++t) {
    CheckCuda(cudaMalloc(dst[t], kLinearElems * sizeof(float)), "cudaMalloc linear operand");
    FillKernel<<<1024, 256>>>(*dst[t], kLinearElems, 4321u + 77u * t);
    CheckCuda(cudaGetLastError(), "fill");
  }
  CheckCuda(cudaDeviceSynchronize(), "generating linear inputs");
  return o;
}

// Linear attention (linear_attention.h) over packed [batch, heads, len, dim] operands.
LinearAttentionParams LinearParams(const LinearOperands& ops, float* o, int batch, int heads,
                                   int kv_heads, int q_len, int kv_len, int d, int dv) {
  LinearAttentionParams p;
  p.batch = batch;
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.q_len = q_len;
  p.kv_len = kv_len;
  p.head_dim = d;
  p.v_head_dim = dv;
  p.q = {ops.q, int64_t{heads} * q_len * d, int64_t{q_len} * d, d};
  p.k = {ops.k, int64_t{kv_heads} * kv_len * d, int64_t{kv_len} * d, d};
  p.v = {ops.v, int64_t{kv_heads} * kv_len * dv, int64_t{kv_len} * dv, dv};
  p.o = o;
  p.o_batch_stride = int64_t{heads} * q_len * dv;
  p.o_head_stride = int64_t{q_len} * dv;
  p.o_row_stride = dv;
  p.causal = true;
  p.feature_map = FeatureMap::kEluPlusOne;
  return p;
}

// Linear attention's kernel, causal, elu + 1, D = Dv = 64, on kTokens x kHeads tokens' worth of
// rows as 16 heads of L = 4096 (beside the flash figures at L 4096: which kernel serves that size
// faster) and as one head of L = 65536 (the recurrence's keys taken one at a time by 2 blocks:
// what a long sequence costs it). The figure is query rows a second; 1 warm-up + kLinearIters
// timed calls.
constexpr int kLinearIters = 3;
void RunLinearShape(int heads, int len, const LinearOperands& ops, float* o, FILE* out) {
  const LinearAttentionParams p = LinearParams(ops, o, 1, heads, heads, len, len, 64, 64);
  const std::vector<double> ms =
      TimeCalls(kLinearIters, [&] { Check(LinearAttentionForward(p, nullptr)); });
  const double median = ms[ms.size() / 2];
  const double rows_per_s = double(heads) * len / (median / 1e3);
  const std::string name =
      "linear/fp32/d64/causal1/L" + std::to_string(len) + "/H" + std::to_string(heads);
  std::fprintf(out,
               "{\"name\": \"%s\", \"kernel\": \"linear\", \"B\": 1, \"H\": %d, \"iters\": %d, "
               "\"median_ms\": %.4f, \"min_ms\": %.4f, \"Mrows_per_s\": %.2f}\n",
               name.c_str(), heads, kLinearIters, median, ms.front(), rows_per_s / 1e6);
  std::fflush(out);
  std::printf("%-32s %9.3f ms  %7.2f M rows/s\n", name.c_str(), median, rows_per_s / 1e6);
  std::fflush(stdout);
}

// The shapes in order of value: if the budget runs out, the most important figures exist.
std::vector<Shape> Sweep() {
  const ComputeType f16 = ComputeType::kFloat16, b16 = ComputeType::kBFloat16;
  std::vector<Shape> s;
  for (int d : {128, 64}) {
    s.push_back({false, f16, d, false, 4096, kFlashIters});
    s.push_back({true, f16, d, false, 4096, kNaiveIters});
    s.push_back({false, b16, d, false, 4096, kFlashIters});
  }
  for (int d : {128, 64}) {
    for (ComputeType t : {f16, b16}) s.push_back({false, t, d, true, 4096, kFlashIters});
  }
  // A causal sliding window of 1024 keys (Mistral's form) on the kMods instantiation, beside
  // the causal figures above: its key blocks before the window are never loaded.
  for (int d : {128, 64}) s.push_back({false, f16, d, true, 4096, kFlashIters, 1023});
  for (int len : {1024, 2048}) s.push_back({false, f16, 128, false, len, kFlashIters});
  // The other tensor-core instantiations (hdim 96, 256, 32, 160, 192), then the generic kernel
  // (d 100: not a multiple of 8).
  for (int d : {96, 256, 32, 160, 192}) s.push_back({false, f16, d, false, 1024, kFlashIters});
  s.push_back({false, f16, 100, false, 1024, kFlashIters});
  return s;
}

// Every kernel path once on a small problem, for compute-sanitizer: the tensor-core kernel at
// hdim 32, 64, 96, 128, 256 (fp16/bf16) and the generic kernel (d 100), plain, causal with Lq > Lk,
// key lengths (0 included), a mask with broadcast strides, GQA, ScoreMods (a window with the
// mask, soft-capped: the kMods instantiations), the naive path, the decode path and linear
// attention.
void Smoke(const Operands& f16, const Operands& b16, const LinearOperands& f32, float* o,
           cublasHandle_t blas) {
  const std::vector<int> cu_q = {0, 100, 101, 160}, cu_k = {0, 70, 200, 330};
  const std::vector<int> lengths = {70, 0, 65};
  int *cq = nullptr, *ck = nullptr, *kl = nullptr;
  uint8_t* mask = nullptr;
  float* v_mean = nullptr;
  CheckCuda(cudaMalloc(&cq, 4 * sizeof(int)), "smoke");
  CheckCuda(cudaMalloc(&ck, 4 * sizeof(int)), "smoke");
  CheckCuda(cudaMalloc(&kl, 3 * sizeof(int)), "smoke");
  CheckCuda(cudaMalloc(&mask, 3 * 130), "smoke");
  CheckCuda(cudaMalloc(&v_mean, 3 * 8 * kMaxDim * sizeof(float)), "smoke");
  CheckCuda(cudaMemcpy(cq, cu_q.data(), 4 * sizeof(int), cudaMemcpyHostToDevice), "smoke");
  CheckCuda(cudaMemcpy(ck, cu_k.data(), 4 * sizeof(int), cudaMemcpyHostToDevice), "smoke");
  CheckCuda(cudaMemcpy(kl, lengths.data(), 3 * sizeof(int), cudaMemcpyHostToDevice), "smoke");
  std::vector<uint8_t> mask_host(3 * 130);
  for (size_t i = 0; i < mask_host.size(); ++i) mask_host[i] = (i * 7) % 5 != 0;
  CheckCuda(cudaMemcpy(mask, mask_host.data(), mask_host.size(), cudaMemcpyHostToDevice), "smoke");
  CheckCuda(cudaMemset(v_mean, 0, 3 * 8 * kMaxDim * sizeof(float)), "smoke");
  for (ComputeType type : {ComputeType::kFloat16, ComputeType::kBFloat16}) {
    const Operands& ops = type == ComputeType::kFloat16 ? f16 : b16;
    for (int d : {64, 128, 96, 32, 256, 100}) {
      for (int variant = 0; variant < 4; ++variant) {
        FlashFwdParams p;
        p.q = ops.q;
        p.k = ops.k;
        p.v = ops.v;
        p.o = o;
        p.num_heads = 8;
        p.num_kv_heads = variant == 2 ? 2 : 8;  // GQA on the third
        p.q_row_stride = p.o_row_stride = int64_t{p.num_heads} * d;
        p.k_row_stride = p.v_row_stride = int64_t{p.num_kv_heads} * d;
        p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
        p.cu_seqlens_q = cq;
        p.cu_seqlens_k = ck;
        p.num_seqs = 3;
        p.max_seqlen_q = 100;
        p.head_dim = p.v_head_dim = d;
        p.scale = 0.1f;
        p.scale_log2 = 0.1f * 1.4426950408889634f;
        p.causal = variant != 0;
        p.key_lengths = variant == 1 ? kl : nullptr;
        if (variant >= 2) {  // [3, 1, 1, 130] key-padding mask, broadcast over heads and rows
          p.mask = mask;
          p.mask_batch_stride = 130;
          p.mask_col_stride = 1;
        }
        if (variant == 3) {  // a causal window of 41 keys, soft-capped
          p.window = {40, 0};
          p.softcap = 30.0f;
        }
        p.v_mean = v_mean;
        Check(FlashForward(p, type, nullptr));
        CheckCuda(cudaDeviceSynchronize(), "smoke flash");
        std::printf("smoke: %s %s d%d variant %d ok\n", ComputeTypeName(type),
                    FlashPathName(SelectFlashPath(p)), d, variant);
        if (variant == 1) {
          void* ws = nullptr;
          CheckCuda(cudaMalloc(&ws, NaiveAttentionWorkspaceBytes(p, cu_q.data(), cu_k.data())),
                    "smoke");
          Check(NaiveAttentionForward(p, type, cu_q.data(), cu_k.data(), lengths.data(), nullptr,
                                      ws, blas, nullptr));
          CheckCuda(cudaDeviceSynchronize(), "smoke naive");
          cudaFree(ws);
          std::printf("smoke: %s naive d%d ok\n", ComputeTypeName(type), d);
        }
      }
    }
  }
  // The decode path: one query token per sequence (the second has none), GQA 4, key lengths
  // (0 included), a key-padding mask.
  const std::vector<int> cu_q1 = {0, 1, 1, 2};
  int* cq1 = nullptr;
  CheckCuda(cudaMalloc(&cq1, 4 * sizeof(int)), "smoke");
  CheckCuda(cudaMemcpy(cq1, cu_q1.data(), 4 * sizeof(int), cudaMemcpyHostToDevice), "smoke");
  for (ComputeType type : {ComputeType::kFloat16, ComputeType::kBFloat16}) {
    const Operands& ops = type == ComputeType::kFloat16 ? f16 : b16;
    for (int d : {64, 96, 128}) {
      FlashFwdParams p;
      p.q = ops.q;
      p.k = ops.k;
      p.v = ops.v;
      p.o = o;
      p.num_heads = 8;
      p.num_kv_heads = 2;
      p.q_row_stride = p.o_row_stride = int64_t{p.num_heads} * d;
      p.k_row_stride = p.v_row_stride = int64_t{p.num_kv_heads} * d;
      p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
      p.cu_seqlens_q = cq1;
      p.cu_seqlens_k = ck;
      p.num_seqs = 3;
      p.max_seqlen_q = 1;
      p.head_dim = p.v_head_dim = d;
      p.scale = 0.1f;
      p.scale_log2 = 0.1f * 1.4426950408889634f;
      p.key_lengths = kl;
      p.mask = mask;
      p.mask_batch_stride = 130;
      p.mask_col_stride = 1;
      p.v_mean = v_mean;
      void* ws = nullptr;
      CheckCuda(cudaMalloc(&ws, FlashDecodeWorkspaceBytes(p, 130)), "smoke");
      Check(FlashDecode(p, type, 130, ws, nullptr));
      CheckCuda(cudaDeviceSynchronize(), "smoke decode");
      cudaFree(ws);
      std::printf("smoke: %s decode d%d ok\n", ComputeTypeName(type), d);
    }
  }
  // Linear attention: GQA 2, more keys than queries (causal, bottom-right), key lengths with a
  // sequence of none, Dv over three 32-column tiles (the last partial), each feature map.
  for (const FeatureMap map : {FeatureMap::kEluPlusOne, FeatureMap::kRelu, FeatureMap::kIdentity}) {
    LinearAttentionParams p = LinearParams(f32, o, 3, 4, 2, 37, 70, 40, 72);
    p.key_lengths = kl;  // 70, 0, 65
    p.feature_map = map;
    Check(LinearAttentionForward(p, nullptr));
    CheckCuda(cudaDeviceSynchronize(), "smoke linear");
    std::printf("smoke: linear feature map %d ok\n", static_cast<int>(map));
  }
  cudaFree(cq1);
  cudaFree(cq);
  cudaFree(ck);
  cudaFree(kl);
  cudaFree(mask);
  cudaFree(v_mean);
}

}  // namespace
}  // namespace attnserve::kernels::cuda

int main(int argc, char** argv) {
  using namespace attnserve::kernels::cuda;
  std::string out_path = "flash_bench.jsonl";
  double budget_s = 100;
  bool smoke = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--out=", 6) == 0) out_path = argv[i] + 6;
    if (std::strncmp(argv[i], "--budget_s=", 11) == 0) budget_s = std::atof(argv[i] + 11);
    if (std::strcmp(argv[i], "--smoke") == 0) smoke = true;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("flash_bench: no CUDA device; nothing to measure\n");
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    float* scratch = nullptr;
    float* o = nullptr;
    const int64_t n = int64_t{kTokens} * kHeads * kMaxDim;
    CheckCuda(cudaMalloc(&scratch, n * sizeof(float)), "cudaMalloc scratch");
    CheckCuda(cudaMalloc(&o, n * sizeof(float)), "cudaMalloc output");
    const Operands f16 = MakeOperands(ComputeType::kFloat16, scratch);
    const Operands b16 = MakeOperands(ComputeType::kBFloat16, scratch);
    cudaFree(scratch);
    const LinearOperands f32 = MakeLinearOperands();
    cublasHandle_t blas = nullptr;
    Check(CublasCheck(cublasCreate(&blas), "cublasCreate"));
    if (smoke) {
      Smoke(f16, b16, f32, o, blas);
      std::printf("smoke: done\n");
      return 0;
    }
    FILE* out = std::fopen(out_path.c_str(), "a");
    if (out == nullptr) throw Fail{"cannot open " + out_path};
    for (const Shape& s : Sweep()) {
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (elapsed > budget_s) {
        std::printf("budget of %.0f s spent; skipping %s and later shapes\n", budget_s,
                    Name(s).c_str());
        break;
      }
      RunShape(s, s.type == ComputeType::kFloat16 ? f16 : b16, o, blas, out);
    }
    // The decode step (milliseconds in all): the fused kernel, then the decode path.
    for (bool decode : {false, true}) RunDecodeShape(decode, f16, o, out);
    // Linear attention's kernel (well under a second at any plausible speed; see run_h200.sh).
    RunLinearShape(kHeads, kTokens, f32, o, out);
    RunLinearShape(1, kTokens * kHeads, f32, o, out);
    std::fclose(out);
  } catch (const Fail& f) {
    std::fprintf(stderr, "flash_bench: %s\n", f.what.c_str());
    return 1;
  }
  return 0;
}
