// CudaBackend::MultiHead and Project: the module's projections (cuBLASLt, TF32) around the
// attention kernels.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_backend_internal.h"
#include "kernels/cuda/device_pages.h"
#include "kernels/cuda/flash_fwd.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/linear_attention.h"
#include "kernels/cuda/online_softmax.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/dtype.h"
#include "kernels/multi_head.h"

namespace attnserve::kernels::cuda {

absl::Status CudaBackend::MultiHead(absl::Span<const MultiHeadParams> batch) {
  return ByOperandType(batch, options_.float32_compute,
                       [this](auto items, ComputeType type) { return MultiHeadAs(items, type); });
}

absl::Status CudaBackend::MultiHeadAs(absl::Span<const MultiHeadParams> batch, ComputeType type) {
  if (batch.empty()) return absl::OkStatus();
  return OnWorker([&](Worker* w) {
    for (const MultiHeadParams& p : batch) {
      if (absl::Status s = RunMultiHead(w, p, type); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

absl::Status CudaBackend::Project(absl::Span<const ProjectionParams> batch) {
  if (batch.empty()) return absl::OkStatus();
  return OnWorker([&](Worker* w) {
    for (const ProjectionParams& p : batch) {
      if (absl::Status s = RunProjection(w, p); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

absl::Status CudaBackend::RunProjection(Worker* w, const ProjectionParams& p) {
  const int dm = p.module->d_model, n = p.n();
  const int64_t rows = p.rows;
  Layout host;
  const size_t h_x = host.Add(rows * dm * sizeof(float));
  const size_t h_y = host.Add(rows * n * sizeof(float));
  absl::Status st = ReservePinned(w, host.size());
  if (!st.ok()) return st;
  Layout dev;
  const size_t d_x = dev.Add(rows * dm * sizeof(float));
  const size_t d_w = dev.Add(size_t(n) * dm * sizeof(float));
  const size_t d_b = dev.Add(size_t(n) * sizeof(float));
  const size_t d_y = dev.Add(rows * n * sizeof(float));
  const size_t d_lt = dev.Add(kLtWorkspaceBytes);
  st = ReserveDevice(w, dev.size());
  if (!st.ok()) return st;
  char* base = w->device;
  cudaStream_t stream = w->stream;
  auto h2d = [&](size_t dev_off, const void* src, size_t bytes, const char* what) {
    return CudaCheck(cudaMemcpyAsync(base + dev_off, src, bytes, cudaMemcpyHostToDevice, stream),
                     what);
  };
  // 16-bit inputs widened (exactly) while they are staged, as MultiHead's.
  float* x = At<float>(w->pinned, h_x);
  ToFloat32(p.x_type, p.x, rows * dm, x);
  RETURN_IF_GPU_ERROR(h2d(d_x, x, rows * dm * sizeof(float), "copying projection inputs"));
  RETURN_IF_GPU_ERROR(h2d(d_w, p.w(), size_t(n) * dm * sizeof(float), "copying weights"));
  RETURN_IF_GPU_ERROR(h2d(d_b, p.bias(), size_t(n) * sizeof(float), "copying the bias"));
  RETURN_IF_GPU_ERROR(LinearForward({At<float>(base, d_x), At<float>(base, d_w),
                                     At<float>(base, d_b), At<float>(base, d_y), rows, dm, n},
                                    w->lt, w->blas, At<void>(base, d_lt), kLtWorkspaceBytes,
                                    stream));
  float* y = At<float>(w->pinned, h_y);
  RETURN_IF_GPU_ERROR(CudaCheck(cudaMemcpyAsync(y, At<float>(base, d_y), rows * n * sizeof(float),
                                                cudaMemcpyDeviceToHost, stream),
                                "copying projections back"));
  RETURN_IF_GPU_ERROR(CudaCheck(cudaStreamSynchronize(stream), "projection"));
  std::memcpy(p.y, y, rows * n * sizeof(float));
  return absl::OkStatus();
}

absl::Status CudaBackend::RunMultiHead(Worker* w, const MultiHeadParams& p, ComputeType type) {
  const MultiHeadWeights& m = *p.module;
  const int dm = m.d_model, h = m.num_heads, dk = m.head_dim();
  // Linear attention runs its own kernel on the float32 projections (linear_attention.h).
  const bool linear = p.kind == AttentionKind::kLinear;
  if (linear) {
    if (absl::Status s =
            CheckLinearAttention(p.mask.present(), p.mods.any(), p.weights != nullptr, dk);
        !s.ok()) {
      return s;
    }
  }
  const int64_t nq = int64_t{p.batch} * p.q_len, nk = int64_t{p.batch} * p.kv_len;
  const bool self = p.self_attention;
  const int num_seqs = p.batch;
  const bool with_weights = p.weights != nullptr;
  // The softmax path's value mean for rows with no allowed key (linear attention has none).
  const bool need_mean = !linear && MayHaveBlockedRows(p.mask.present(), p.key_lengths, p.causal,
                                                       p.q_len, p.kv_len, p.mods.windowed());
  const int64_t mask_bytes =
      p.mask.present() ? MaskExtent(p.mask, p.batch, h, p.q_len, p.kv_len) : 0;

  Layout host;
  const size_t h_xq = host.Add(nq * dm * sizeof(float));
  const size_t h_xk = host.Add(self ? 0 : nk * dm * sizeof(float));
  const size_t h_xv = host.Add(self ? 0 : nk * dm * sizeof(float));
  const size_t h_out = host.Add(nq * dm * sizeof(float));
  const size_t h_cu = host.Add((3 * num_seqs + 2) * sizeof(int));
  absl::Status st = ReservePinned(w, host.size());
  if (!st.ok()) return st;

  int* cu_q = At<int>(w->pinned, h_cu);
  int* cu_k = cu_q + num_seqs + 1;
  int* klen = cu_k + num_seqs + 1;
  cu_q[0] = cu_k[0] = 0;
  for (int b = 0; b < num_seqs; ++b) {
    cu_q[b + 1] = cu_q[b] + p.q_len;
    cu_k[b + 1] = cu_k[b] + p.kv_len;
    klen[b] = p.key_lengths != nullptr ? p.key_lengths[b] : p.kv_len;
  }

  // Projections: self-attention -> one [nq, 3 dm] GEMM; else three.
  const int64_t proj_elems = self ? nq * 3 * dm : nq * dm + 2 * nk * dm;
  Layout dev;
  const size_t d_xq = dev.Add(nq * dm * sizeof(float));
  const size_t d_xk = dev.Add(self ? 0 : nk * dm * sizeof(float));
  const size_t d_xv = dev.Add(self ? 0 : nk * dm * sizeof(float));
  const size_t d_wqkv = dev.Add(m.w_qkv.size() * sizeof(float));
  const size_t d_bqkv = dev.Add(m.b_qkv.size() * sizeof(float));
  const size_t d_wo = dev.Add(m.w_o.size() * sizeof(float));
  const size_t d_bo = dev.Add(m.b_o.size() * sizeof(float));
  const size_t d_proj = dev.Add(proj_elems * sizeof(float));
  // The 16-bit copy of the projections the softmax kernels read (linear attention reads the
  // float32 ones).
  const size_t d_proj16 = dev.Add(linear ? 0 : proj_elems * 2);
  const size_t d_attn = dev.Add(nq * dm * sizeof(float));
  const size_t d_out = dev.Add(nq * dm * sizeof(float));
  const size_t d_cu = dev.Add((3 * num_seqs + 2) * sizeof(int));
  const size_t d_mean = dev.Add(need_mean ? size_t(num_seqs) * h * dk * sizeof(float) : 0);
  const size_t d_mask = dev.Add(mask_bytes);
  const size_t d_weights =
      dev.Add(with_weights ? size_t(p.batch) * h * p.q_len * p.kv_len * sizeof(float) : 0);
  const size_t d_lt = dev.Add(kLtWorkspaceBytes);
  const size_t d_slopes = dev.Add(p.mods.alibi_slopes != nullptr ? h * sizeof(float) : 0);

  // The heads of the projections as HeadAttentionParams splits them for every backend: rows of
  // the fused [nq, 3 dm] buffer (self-attention) or of three [n, dm] ones, the concatenated
  // output [nq, dm]. Only its shape is used here; the pointers are device ones, set below.
  const int64_t proj_ld = self ? 3 * dm : dm;
  const AttentionParams heads = HeadAttentionParams(
      p, ProjectedQkv{nullptr, proj_ld, nullptr, proj_ld, nullptr, proj_ld, DType::kFloat32},
      nullptr, dm);
  FlashFwdParams fp = FlashParamsFor(
      heads, num_seqs, p.q_len, {heads.q.row_stride, heads.k.row_stride, heads.v.row_stride, dm});
  // The naive path's workspace is sized before the pointers are known; SelectFlashPath only
  // returns kUnsupported for v_head_dim > 256 here (the buffers are all suitably aligned).
  const bool naive_expected = with_weights || dk > kGenericMaxVHeadDim;
  const size_t d_ws = dev.Add(naive_expected ? NaiveAttentionWorkspaceBytes(fp, cu_q, cu_k) : 0);
  st = ReserveDevice(w, dev.size());
  if (!st.ok()) return st;
  char* base = w->device;
  cudaStream_t stream = w->stream;
  float* proj = At<float>(base, d_proj);
  char* proj16 = At<char>(base, d_proj16);
  const float* q32 = proj;
  const float* k32 = self ? proj + dm : proj + nq * dm;
  const float* v32 = self ? proj + 2 * dm : proj + nq * dm + nk * dm;
  fp.q = proj16 + (q32 - proj) * 2;
  fp.k = proj16 + (k32 - proj) * 2;
  fp.v = proj16 + (v32 - proj) * 2;
  fp.o = At<float>(base, d_attn);
  fp.cu_seqlens_q = At<int>(base, d_cu);
  fp.cu_seqlens_k = fp.cu_seqlens_q + num_seqs + 1;
  fp.key_lengths = p.key_lengths != nullptr ? fp.cu_seqlens_k + num_seqs + 1 : nullptr;
  fp.v_mean = need_mean ? At<float>(base, d_mean) : nullptr;
  if (p.mask.present()) fp.mask = At<uint8_t>(base, d_mask);
  const bool naive = naive_expected;

  auto h2d = [&](size_t dev_off, const void* src, size_t bytes, const char* what) {
    return CudaCheck(cudaMemcpyAsync(base + dev_off, src, bytes, cudaMemcpyHostToDevice, stream),
                     what);
  };
  RETURN_IF_GPU_ERROR(h2d(d_cu, cu_q, (3 * num_seqs + 2) * sizeof(int), "copying tables"));
  if (p.mask.present()) RETURN_IF_GPU_ERROR(h2d(d_mask, p.mask.data, mask_bytes, "copying mask"));
  if (p.mods.alibi_slopes != nullptr) {
    fp.alibi_slopes = At<float>(base, d_slopes);
    RETURN_IF_GPU_ERROR(
        h2d(d_slopes, p.mods.alibi_slopes, h * sizeof(float), "copying the ALiBi slopes"));
  }
  // Weights straight from the module's vectors (pageable; see the report on caching them).
  RETURN_IF_GPU_ERROR(h2d(d_wqkv, m.w_qkv.data(), m.w_qkv.size() * sizeof(float), "copying W_qkv"));
  RETURN_IF_GPU_ERROR(h2d(d_bqkv, m.b_qkv.data(), m.b_qkv.size() * sizeof(float), "copying b_qkv"));
  RETURN_IF_GPU_ERROR(h2d(d_wo, m.w_o.data(), m.w_o.size() * sizeof(float), "copying W_o"));
  RETURN_IF_GPU_ERROR(h2d(d_bo, m.b_o.data(), m.b_o.size() * sizeof(float), "copying b_o"));
  const float* wqkv = At<float>(base, d_wqkv);
  const float* bqkv = At<float>(base, d_bqkv);
  void* lt_ws = At<void>(base, d_lt);
  // The projections take float32: 16-bit inputs are widened while they are staged (the staging
  // copy is made either way).
  auto stage = [&](size_t host_off, size_t dev_off, const void* src, int64_t rows) {
    float* dst = At<float>(w->pinned, host_off);
    ToFloat32(p.input_dtype, src, rows * dm, dst);
    return h2d(dev_off, dst, rows * dm * sizeof(float), "copying inputs");
  };
  RETURN_IF_GPU_ERROR(stage(h_xq, d_xq, p.query, nq));
  if (self) {
    RETURN_IF_GPU_ERROR(LinearForward({At<float>(base, d_xq), wqkv, bqkv, proj, nq, dm, 3 * dm},
                                      w->lt, w->blas, lt_ws, kLtWorkspaceBytes, stream));
  } else {
    RETURN_IF_GPU_ERROR(stage(h_xk, d_xk, p.key, nk));
    RETURN_IF_GPU_ERROR(stage(h_xv, d_xv, p.value, nk));
    const int64_t dd = int64_t{dm} * dm;
    RETURN_IF_GPU_ERROR(LinearForward({At<float>(base, d_xq), wqkv, bqkv, proj, nq, dm, dm}, w->lt,
                                      w->blas, lt_ws, kLtWorkspaceBytes, stream));
    RETURN_IF_GPU_ERROR(
        LinearForward({At<float>(base, d_xk), wqkv + dd, bqkv + dm, proj + nq * dm, nk, dm, dm},
                      w->lt, w->blas, lt_ws, kLtWorkspaceBytes, stream));
    RETURN_IF_GPU_ERROR(LinearForward(
        {At<float>(base, d_xv), wqkv + 2 * dd, bqkv + 2 * dm, proj + nq * dm + nk * dm, nk, dm, dm},
        w->lt, w->blas, lt_ws, kLtWorkspaceBytes, stream));
  }
  if (linear) {
    LinearAttentionParams lp = LinearShapeOf(heads);
    lp.q = {q32, heads.q.batch_stride, heads.q.head_stride, heads.q.row_stride};
    lp.k = {k32, heads.k.batch_stride, heads.k.head_stride, heads.k.row_stride};
    lp.v = {v32, heads.v.batch_stride, heads.v.head_stride, heads.v.row_stride};
    lp.o = fp.o;
    lp.o_batch_stride = heads.out.batch_stride;
    lp.o_head_stride = heads.out.head_stride;
    lp.o_row_stride = heads.out.row_stride;
    lp.key_lengths = fp.key_lengths;  // the device's copy of klen
    RETURN_IF_GPU_ERROR(LinearAttentionForward(lp, stream));
  } else {
    RETURN_IF_GPU_ERROR(ConvertFromFloat(proj, proj16, proj_elems, type, stream));
    if (need_mean) {
      RETURN_IF_GPU_ERROR(ValueMean(v32, fp.v_row_stride, fp.v_head_stride, fp.cu_seqlens_k,
                                    num_seqs, h, dk, At<float>(base, d_mean), stream));
    }
    if (naive) {
      RETURN_IF_GPU_ERROR(NaiveAttentionForward(fp, type, cu_q, cu_k,
                                                p.key_lengths != nullptr ? klen : nullptr,
                                                with_weights ? At<float>(base, d_weights) : nullptr,
                                                At<void>(base, d_ws), w->blas, stream));
    } else {
      RETURN_IF_GPU_ERROR(FlashForward(fp, type, stream));
    }
  }
  RETURN_IF_GPU_ERROR(LinearForward(
      {fp.o, At<float>(base, d_wo), At<float>(base, d_bo), At<float>(base, d_out), nq, dm, dm},
      w->lt, w->blas, lt_ws, kLtWorkspaceBytes, stream));
  float* out_host = At<float>(w->pinned, h_out);
  RETURN_IF_GPU_ERROR(
      CudaCheck(cudaMemcpyAsync(out_host, At<float>(base, d_out), nq * dm * sizeof(float),
                                cudaMemcpyDeviceToHost, stream),
                "copying the output back"));
  if (with_weights) {
    RETURN_IF_GPU_ERROR(
        CudaCheck(cudaMemcpyAsync(p.weights, At<float>(base, d_weights),
                                  size_t(p.batch) * h * p.q_len * p.kv_len * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream),
                  "copying the weights back"));
  }
  RETURN_IF_GPU_ERROR(CudaCheck(cudaStreamSynchronize(stream), "multi-head attention"));
  std::memcpy(p.out, out_host, nq * dm * sizeof(float));
  return absl::OkStatus();
}

}  // namespace attnserve::kernels::cuda
