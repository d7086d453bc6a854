// CudaBackend::Attend: dense attention, items packed into variable-length launches
// (PlanAttentionGroups), the fused, decode and naive kernels (cuda_backend.h).
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
namespace {

bool SameMods(const AttentionParams& a, const AttentionParams& b) {
  const ScoreMods &x = a.mods, &y = b.mods;
  if (x.window_left != y.window_left || x.window_right != y.window_right ||
      x.softcap != y.softcap || (x.alibi_slopes == nullptr) != (y.alibi_slopes == nullptr)) {
    return false;
  }
  return x.alibi_slopes == nullptr ||
         std::equal(x.alibi_slopes, x.alibi_slopes + a.num_heads, y.alibi_slopes);
}

bool Compatible(const AttentionParams& a, const AttentionParams& b) {
  return a.num_heads == b.num_heads && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.v_head_dim == b.v_head_dim && a.causal == b.causal &&
         a.scale == b.scale && !a.mask.present() && !b.mask.present() && a.weights == nullptr &&
         b.weights == nullptr && (a.q_len == 1) == (b.q_len == 1) && SameMods(a, b);
}

// An upper bound of the pinned staging an item adds to a launch group (RunAttentionGroup's
// host layout without the alignment, which kGroupSlack covers): q, k, v, out, a float32 copy
// of v, the sequence tables.
int64_t PinnedBytes(const AttentionParams& p) {
  const int64_t q = int64_t{p.batch} * p.q_len * p.num_heads;
  const int64_t k = int64_t{p.batch} * p.kv_len * p.num_kv_heads;
  return int64_t{sizeof(float)} *
             (q * (p.head_dim + p.v_head_dim) + k * (p.head_dim + 2 * p.v_head_dim)) +
         int64_t{3 * sizeof(int)} * p.batch;
}
constexpr int64_t kGroupSlack = 16 * 256;  // Layout rounds each of a group's buffers to 256

}  // namespace

std::vector<std::pair<size_t, size_t>> PlanAttentionGroups(absl::Span<const AttentionParams> batch,
                                                           int64_t pinned_limit) {
  std::vector<std::pair<size_t, size_t>> groups;
  size_t i = 0;
  while (i < batch.size()) {
    int64_t bytes = kGroupSlack + PinnedBytes(batch[i]);
    size_t j = i + 1;
    while (j < batch.size() && Compatible(batch[i], batch[j]) &&
           bytes + PinnedBytes(batch[j]) <= pinned_limit) {
      bytes += PinnedBytes(batch[j]);
      ++j;
    }
    groups.emplace_back(i, j);
    i = j;
  }
  return groups;
}

absl::Status CudaBackend::Attend(absl::Span<const AttentionParams> batch) {
  // Linear attention's items take their own kernel, one launch each, in float32 whatever the
  // input dtype (as the CPU backend computes them); the rest as before.
  std::vector<AttentionParams> softmax;
  if (std::any_of(batch.begin(), batch.end(),
                  [](const AttentionParams& p) { return p.kind == AttentionKind::kLinear; })) {
    for (const AttentionParams& p : batch) {
      if (p.kind != AttentionKind::kLinear) softmax.push_back(p);
    }
    absl::Status st = OnWorker([&](Worker* w) {
      for (const AttentionParams& p : batch) {
        if (p.kind != AttentionKind::kLinear) continue;
        if (absl::Status s = RunLinearAttention(w, p); !s.ok()) return s;
      }
      return absl::OkStatus();
    });
    if (!st.ok()) return st;
    batch = softmax;
  }
  return ByOperandType(batch, options_.float32_compute,
                       [this](auto items, ComputeType type) { return AttendAs(items, type); });
}

absl::Status CudaBackend::RunLinearAttention(Worker* w, const AttentionParams& p) {
  if (absl::Status s =
          CheckLinearAttention(p.mask.present(), p.mods.any(), p.weights != nullptr, p.head_dim);
      !s.ok()) {
    return s;
  }
  const int64_t nq = int64_t{p.batch} * p.num_heads * p.q_len;
  const int64_t nk = int64_t{p.batch} * p.num_kv_heads * p.kv_len;
  const int d = p.head_dim, dv = p.v_head_dim;
  // Staged packed [batch, heads, rows, dim] in float32 (16-bit inputs widened on the way).
  // The same buffers in pinned memory and on the device: q, k, v, o, the key lengths.
  struct Offsets {
    size_t q, k, v, o, len;
  };
  auto lay_out = [&](Layout* l) {
    return Offsets{l->Add(nq * d * sizeof(float)), l->Add(nk * d * sizeof(float)),
                   l->Add(nk * dv * sizeof(float)), l->Add(nq * dv * sizeof(float)),
                   l->Add(p.key_lengths != nullptr ? p.batch * sizeof(int) : 0)};
  };
  Layout host, dev;
  const Offsets at_host = lay_out(&host), at_dev = lay_out(&dev);
  absl::Status st = ReservePinned(w, host.size());
  if (!st.ok()) return st;
  st = ReserveDevice(w, dev.size());
  if (!st.ok()) return st;
  char* base = w->device;
  cudaStream_t stream = w->stream;
  const size_t esize = DTypeSize(p.input_dtype);
  auto stage = [&](const InputView& view, int heads, int rows, int dim, size_t host_off,
                   size_t dev_off) {
    float* dst = At<float>(w->pinned, host_off);
    for (int b = 0; b < p.batch; ++b) {
      for (int h = 0; h < heads; ++h) {
        for (int r = 0; r < rows; ++r, dst += dim) {
          ToFloat32(p.input_dtype,
                    static_cast<const char*>(view.data) + view.offset(b, h, r) * esize,
                    static_cast<size_t>(dim), dst);
        }
      }
    }
    const size_t bytes = size_t(p.batch) * heads * rows * dim * sizeof(float);
    return CudaCheck(cudaMemcpyAsync(base + dev_off, At<float>(w->pinned, host_off), bytes,
                                     cudaMemcpyHostToDevice, stream),
                     "copying inputs to the device");
  };
  RETURN_IF_GPU_ERROR(stage(p.q, p.num_heads, p.q_len, d, at_host.q, at_dev.q));
  RETURN_IF_GPU_ERROR(stage(p.k, p.num_kv_heads, p.kv_len, d, at_host.k, at_dev.k));
  RETURN_IF_GPU_ERROR(stage(p.v, p.num_kv_heads, p.kv_len, dv, at_host.v, at_dev.v));
  if (p.key_lengths != nullptr) {
    std::memcpy(At<int>(w->pinned, at_host.len), p.key_lengths, p.batch * sizeof(int));
    RETURN_IF_GPU_ERROR(
        CudaCheck(cudaMemcpyAsync(At<int>(base, at_dev.len), At<int>(w->pinned, at_host.len),
                                  p.batch * sizeof(int), cudaMemcpyHostToDevice, stream),
                  "copying key lengths"));
  }
  const auto packed = [&](size_t off, int heads, int rows, int dim) {
    return LinearView{At<float>(base, off), int64_t{heads} * rows * dim, int64_t{rows} * dim, dim};
  };
  LinearAttentionParams lp = LinearShapeOf(p);
  lp.q = packed(at_dev.q, p.num_heads, p.q_len, d);
  lp.k = packed(at_dev.k, p.num_kv_heads, p.kv_len, d);
  lp.v = packed(at_dev.v, p.num_kv_heads, p.kv_len, dv);
  lp.o = At<float>(base, at_dev.o);
  lp.o_batch_stride = int64_t{p.num_heads} * p.q_len * dv;
  lp.o_head_stride = int64_t{p.q_len} * dv;
  lp.o_row_stride = dv;
  lp.key_lengths = p.key_lengths != nullptr ? At<int>(base, at_dev.len) : nullptr;
  RETURN_IF_GPU_ERROR(LinearAttentionForward(lp, stream));
  float* out_host = At<float>(w->pinned, at_host.o);
  RETURN_IF_GPU_ERROR(CudaCheck(
      cudaMemcpyAsync(out_host, lp.o, nq * dv * sizeof(float), cudaMemcpyDeviceToHost, stream),
      "copying the output back"));
  RETURN_IF_GPU_ERROR(CudaCheck(cudaStreamSynchronize(stream), "linear attention"));
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.num_heads; ++h) {
      for (int r = 0; r < p.q_len; ++r, out_host += dv) {
        std::memcpy(p.out.row(b, h, r), out_host, dv * sizeof(float));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::AttendAs(absl::Span<const AttentionParams> batch, ComputeType type) {
  if (batch.empty()) return absl::OkStatus();
  return OnWorker([&](Worker* w) {
    for (const auto& [begin, end] :
         PlanAttentionGroups(batch, options_.pinned_staging_bytes_per_stream)) {
      if (absl::Status s = RunAttentionGroup(w, batch.subspan(begin, end - begin), type); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  });
}

absl::Status CudaBackend::RunAttentionGroup(Worker* w, absl::Span<const AttentionParams> items,
                                            ComputeType type) {
  const AttentionParams& first = items[0];
  const int hq = first.num_heads, hkv = first.num_kv_heads;
  const int d = first.head_dim, dv = first.v_head_dim;
  int num_seqs = 0, max_q = 0;
  int64_t tq = 0, tk = 0;
  bool any_key_lengths = false, need_mean = false;
  for (const AttentionParams& p : items) {
    num_seqs += p.batch;
    tq += int64_t{p.batch} * p.q_len;
    tk += int64_t{p.batch} * p.kv_len;
    max_q = std::max(max_q, p.q_len);
    any_key_lengths |= p.key_lengths != nullptr;
    need_mean |= MayHaveBlockedRows(p.mask.present(), p.key_lengths, p.causal, p.q_len, p.kv_len,
                                    p.mods.windowed());
  }
  const bool with_weights = first.weights != nullptr;  // then items.size() == 1
  const int64_t mask_bytes =
      first.mask.present() ? MaskExtent(first.mask, first.batch, hq, first.q_len, first.kv_len) : 0;

  // Pinned staging: inputs, output, sequence tables.
  Layout host;
  const size_t h_q = host.Add(tq * hq * d * sizeof(float));
  const size_t h_k = host.Add(tk * hkv * d * sizeof(float));
  const size_t h_v = host.Add(tk * hkv * dv * sizeof(float));
  const size_t h_o = host.Add(tq * hq * dv * sizeof(float));
  const size_t h_cu = host.Add((3 * num_seqs + 2) * sizeof(int));
  // 16-bit inputs (the group shares one input_dtype, and OperandType made it `type`) go to the
  // device as they are; only the value mean, when needed, reads a float32 copy of v.
  const bool as_is = first.input_dtype != DType::kFloat32;
  const size_t h_v32 = host.Add(as_is && need_mean ? tk * hkv * dv * sizeof(float) : 0);
  // Device buffers.
  Layout dev;
  const size_t d_q32 = dev.Add(tq * hq * d * sizeof(float));
  const size_t d_k32 = dev.Add(tk * hkv * d * sizeof(float));
  const size_t d_v32 = dev.Add(tk * hkv * dv * sizeof(float));
  const size_t d_q16 = dev.Add(tq * hq * d * 2);
  const size_t d_k16 = dev.Add(tk * hkv * d * 2);
  const size_t d_v16 = dev.Add(tk * hkv * dv * 2);
  const size_t d_o = dev.Add(tq * hq * dv * sizeof(float));
  const size_t d_cu = dev.Add((3 * num_seqs + 2) * sizeof(int));
  const size_t d_mean = dev.Add(need_mean ? size_t(num_seqs) * hkv * dv * sizeof(float) : 0);
  const size_t d_mask = dev.Add(mask_bytes);
  const size_t d_weights = dev.Add(
      with_weights ? size_t(first.batch) * hq * first.q_len * first.kv_len * sizeof(float) : 0);
  const size_t d_slopes = dev.Add(first.mods.alibi_slopes != nullptr ? hq * sizeof(float) : 0);

  absl::Status st = ReservePinned(w, host.size());
  if (!st.ok()) return st;

  // Sequence tables (host copies are also what the naive path reads).
  int* cu_q = At<int>(w->pinned, h_cu);
  int* cu_k = cu_q + num_seqs + 1;
  int* klen = cu_k + num_seqs + 1;
  {
    int s = 0;
    cu_q[0] = cu_k[0] = 0;
    for (const AttentionParams& p : items) {
      for (int b = 0; b < p.batch; ++b, ++s) {
        cu_q[s + 1] = cu_q[s] + p.q_len;
        cu_k[s + 1] = cu_k[s] + p.kv_len;
        klen[s] = p.key_lengths != nullptr ? p.key_lengths[b] : p.kv_len;
      }
    }
  }
  // Packed [tokens, heads, dim] (below).
  FlashFwdParams fp =
      FlashParamsFor(first, num_seqs, max_q,
                     {int64_t{hq} * d, int64_t{hkv} * d, int64_t{hkv} * dv, int64_t{hq} * dv});
  const bool naive = with_weights || SelectFlashPath(fp) == FlashPath::kUnsupported;
  // Decode steps (one query token per sequence) take the decode path (flash_decode_kernel.h).
  // Compatible() never packs a q_len == 1 item with others, so the choice depends only on the
  // item itself (batch invariance).
  const bool decode = !naive && DecodeSupported(fp);
  int max_k = 0;
  for (int s = 0; s < num_seqs; ++s) max_k = std::max(max_k, cu_k[s + 1] - cu_k[s]);
  const size_t d_ws = dev.Add(naive    ? NaiveAttentionWorkspaceBytes(fp, cu_q, cu_k)
                              : decode ? FlashDecodeWorkspaceBytes(fp, max_k)
                                       : 0);
  st = ReserveDevice(w, dev.size());
  if (!st.ok()) return st;
  char* base = w->device;
  fp.q = At<void>(base, d_q16);
  fp.k = At<void>(base, d_k16);
  fp.v = At<void>(base, d_v16);
  fp.o = At<float>(base, d_o);
  fp.cu_seqlens_q = At<int>(base, d_cu);
  fp.cu_seqlens_k = fp.cu_seqlens_q + num_seqs + 1;
  fp.key_lengths = any_key_lengths ? fp.cu_seqlens_k + num_seqs + 1 : nullptr;
  fp.v_mean = need_mean ? At<float>(base, d_mean) : nullptr;
  if (first.mask.present()) fp.mask = At<uint8_t>(base, d_mask);
  cudaStream_t stream = w->stream;
  if (first.mods.alibi_slopes != nullptr) {  // the group shares them (Compatible)
    fp.alibi_slopes = At<float>(base, d_slopes);
    RETURN_IF_GPU_ERROR(
        CudaCheck(cudaMemcpyAsync(At<float>(base, d_slopes), first.mods.alibi_slopes,
                                  hq * sizeof(float), cudaMemcpyHostToDevice, stream),
                  "copying the ALiBi slopes"));
  }
  RETURN_IF_GPU_ERROR(
      CudaCheck(cudaMemcpyAsync(At<int>(base, d_cu), cu_q, (3 * num_seqs + 2) * sizeof(int),
                                cudaMemcpyHostToDevice, stream),
                "copying sequence tables"));
  if (first.mask.present()) {
    RETURN_IF_GPU_ERROR(CudaCheck(cudaMemcpyAsync(At<uint8_t>(base, d_mask), first.mask.data,
                                                  mask_bytes, cudaMemcpyHostToDevice, stream),
                                  "copying the mask"));
  }

  // Pack q, k, v into [tokens, heads, dim] and send each while the next is packed.
  struct Tensor {
    size_t host, dev32, dev16;
    int heads, dim;
    int64_t tokens;
    int which;  // 0 q, 1 k, 2 v
  };
  const Tensor tensors[3] = {{h_q, d_q32, d_q16, hq, d, tq, 0},
                             {h_k, d_k32, d_k16, hkv, d, tk, 1},
                             {h_v, d_v32, d_v16, hkv, dv, tk, 2}};
  const size_t esize = DTypeSize(first.input_dtype);
  for (const Tensor& t : tensors) {
    char* dst = At<char>(w->pinned, t.host);
    float* dst32 = At<float>(w->pinned, h_v32);
    const bool widen_v = as_is && need_mean && t.which == 2;
    int64_t token0 = 0;
    for (const AttentionParams& p : items) {
      const InputView& view = t.which == 0 ? p.q : (t.which == 1 ? p.k : p.v);
      const int len = t.which == 0 ? p.q_len : p.kv_len;
      for (int b = 0; b < p.batch; ++b) {
        for (int h = 0; h < t.heads; ++h) {
          for (int r = 0; r < len; ++r) {
            const int64_t at = ((token0 + r) * t.heads + h) * t.dim;
            const char* src = static_cast<const char*>(view.data) + view.offset(b, h, r) * esize;
            std::memcpy(dst + at * esize, src, t.dim * esize);
            if (widen_v) ToFloat32(first.input_dtype, src, t.dim, dst32 + at);
          }
        }
        token0 += len;
      }
    }
    const int64_t n = t.tokens * t.heads * t.dim;
    if (as_is) {
      RETURN_IF_GPU_ERROR(CudaCheck(
          cudaMemcpyAsync(At<char>(base, t.dev16), dst, n * esize, cudaMemcpyHostToDevice, stream),
          "copying inputs to the device"));
      if (widen_v) {
        RETURN_IF_GPU_ERROR(
            CudaCheck(cudaMemcpyAsync(At<float>(base, t.dev32), dst32, n * sizeof(float),
                                      cudaMemcpyHostToDevice, stream),
                      "copying inputs to the device"));
      }
      continue;
    }
    RETURN_IF_GPU_ERROR(CudaCheck(cudaMemcpyAsync(At<float>(base, t.dev32), dst, n * sizeof(float),
                                                  cudaMemcpyHostToDevice, stream),
                                  "copying inputs to the device"));
    RETURN_IF_GPU_ERROR(
        ConvertFromFloat(At<float>(base, t.dev32), At<void>(base, t.dev16), n, type, stream));
  }
  if (need_mean) {
    RETURN_IF_GPU_ERROR(ValueMean(At<float>(base, d_v32), fp.v_row_stride, fp.v_head_stride,
                                  fp.cu_seqlens_k, num_seqs, hkv, dv, At<float>(base, d_mean),
                                  stream));
  }
  if (naive) {
    RETURN_IF_GPU_ERROR(NaiveAttentionForward(fp, type, cu_q, cu_k,
                                              any_key_lengths ? klen : nullptr,
                                              with_weights ? At<float>(base, d_weights) : nullptr,
                                              At<void>(base, d_ws), w->blas, stream));
  } else if (decode) {
    RETURN_IF_GPU_ERROR(FlashDecode(fp, type, max_k, At<void>(base, d_ws), stream));
  } else {
    RETURN_IF_GPU_ERROR(FlashForward(fp, type, stream));
  }
  float* out_host = At<float>(w->pinned, h_o);
  RETURN_IF_GPU_ERROR(CudaCheck(
      cudaMemcpyAsync(out_host, fp.o, tq * hq * dv * sizeof(float), cudaMemcpyDeviceToHost, stream),
      "copying the output back"));
  if (with_weights) {
    RETURN_IF_GPU_ERROR(CudaCheck(
        cudaMemcpyAsync(first.weights, At<float>(base, d_weights),
                        size_t(first.batch) * hq * first.q_len * first.kv_len * sizeof(float),
                        cudaMemcpyDeviceToHost, stream),
        "copying the weights back"));
  }
  RETURN_IF_GPU_ERROR(CudaCheck(cudaStreamSynchronize(stream), "attention"));

  int64_t token0 = 0;
  for (const AttentionParams& p : items) {
    for (int b = 0; b < p.batch; ++b) {
      for (int h = 0; h < hq; ++h) {
        for (int r = 0; r < p.q_len; ++r) {
          std::memcpy(p.out.row(b, h, r), out_host + ((token0 + r) * hq + h) * dv,
                      dv * sizeof(float));
        }
      }
      token0 += p.q_len;
    }
  }
  return absl::OkStatus();
}

}  // namespace attnserve::kernels::cuda
