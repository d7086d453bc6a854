#include "kernels/cpu/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/available_cores.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/linear_attention.h"
#include "kernels/cpu/projection.h"
#include "kernels/cpu/scratch.h"

namespace attnserve::kernels::cpu {
namespace {

// One attention task: rows [i0, i0 + kQueryBlock) of (b, h) of batch item `item`; `packed` is
// the packed K and V of (b, h / group) when the item computes in bfloat16, else nullptr.
struct AttentionTask {
  int item;
  int b;
  int h;
  int i0;
  const void* packed;
};

// One packing task of the bfloat16 path: K and V of (b, kv head) of batch item `item`.
struct PackTask {
  int item;
  int b;
  int kvh;
  void* packed;
};

// One projection task: y = x · wᵀ + bias over `rows` rows (see Linear); x of element type
// x_type. In float32 (w, y float32; 16-bit x widened by the task) or, when w16 is set, with
// bfloat16 operands (x rounded to bfloat16 by the task unless it is already; y of type y_type).
struct GemmTask {
  const void* x;
  DType x_type;
  int64_t ldx;
  int64_t rows;
  int k;
  const float* w;
  const uint16_t* w16;
  const float* bias;
  int n;
  void* y;
  DType y_type;
  int64_t ldy;
};

// Rows per projection task. A function of the GEMM's row count only, never of the thread count
// or the batch, so every row's bits are fixed by its request. About 8 tasks per GEMM, of 128 to
// 1024 rows: OpenBLAS repacks the whole weight matrix on every call, so small chunks cost
// throughput. Measured, one thread, sgemm 4096x1536x512 in chunks of 128 / 256 / 512 / 1024 /
// 4096 rows: 73-96 / 92-99 / 95-99 / 100-103 / 102-103 GFLOP per CPU-second.
int64_t GemmRowChunk(int64_t rows) {
  return std::clamp<int64_t>(((rows + 7) / 8 + 63) / 64 * 64, 128, 1024);
}

// Appends the tasks of one projection, cut into chunks of GemmRowChunk(rows) rows. `w16` (the
// bfloat16 copy of w, or nullptr) selects the bfloat16 path.
void AddGemm(const void* x, DType x_type, int64_t ldx, int64_t rows, int k, const float* w,
             const uint16_t* w16, const float* bias, int n, void* y, DType y_type, int64_t ldy,
             std::vector<GemmTask>* tasks) {
  const int64_t chunk = GemmRowChunk(rows);
  const size_t x_size = DTypeSize(x_type);
  const size_t y_size = DTypeSize(y_type);
  for (int64_t r = 0; r < rows; r += chunk) {
    tasks->push_back(GemmTask{static_cast<const char*>(x) + r * ldx * x_size, x_type, ldx,
                              std::min<int64_t>(chunk, rows - r), k, w, w16, bias, n,
                              static_cast<char*>(y) + r * ldy * y_size, y_type, ldy});
  }
}

// The arithmetic of a set of projection tasks, for CpuBackend::ThreadsFor.
double GemmFlops(const std::vector<GemmTask>& tasks) {
  double flops = 0;
  for (const GemmTask& g : tasks) flops += 2.0 * static_cast<double>(g.rows) * g.k * g.n;
  return flops;
}

// Runs projection tasks on `threads` threads of the pool, one task per chunk of rows
// (GemmRowChunk). `bf16_kernel` rounds inputs to bfloat16 for tasks with w16 set (REQUIRES it
// then).
void RunGemms(ThreadPool& pool, int threads, const Bf16AttentionKernel* bf16_kernel,
              const std::vector<GemmTask>& tasks) {
  pool.ParallelFor(static_cast<int64_t>(tasks.size()), threads, [&](int64_t t) {
    const GemmTask& g = tasks[t];
    const size_t x_size = DTypeSize(g.x_type);
    const char* x = static_cast<const char*>(g.x);
    if (g.w16 != nullptr) {
      // bfloat16 operands: x as it is when it is bfloat16, else rounded chunk-wise.
      if (g.x_type == DType::kBFloat16) {
        LinearBf16(reinterpret_cast<const uint16_t*>(x), g.ldx, g.rows, g.k, g.w16, g.bias, g.n,
                   g.y, g.y_type, g.ldy);
        return;
      }
      ScratchBuffer scratch(ScratchUse::kTask, g.rows * g.k * 2);
      uint16_t* x16 = reinterpret_cast<uint16_t*>(scratch.data());
      for (int64_t r = 0; r < g.rows; ++r) {
        bf16_kernel->to_bf16(g.x_type, x + r * g.ldx * x_size, g.k, x16 + r * g.k);
      }
      LinearBf16(x16, g.k, g.rows, g.k, g.w16, g.bias, g.n, g.y, g.y_type, g.ldy);
      return;
    }
    float* y = static_cast<float*>(g.y);
    if (g.x_type == DType::kFloat32) {
      Linear(reinterpret_cast<const float*>(x), g.ldx, g.rows, g.k, g.w, g.bias, g.n, y, g.ldy);
      return;
    }
    // 16-bit inputs: this chunk's rows widened (exactly) into the thread's scratch.
    ScratchBuffer scratch(ScratchUse::kTask, g.rows * g.k * int64_t{4});
    float* xf = scratch.floats();
    for (int64_t r = 0; r < g.rows; ++r)
      ToFloat32(g.x_type, x + r * g.ldx * x_size, g.k, xf + r * g.k);
    Linear(xf, g.k, g.rows, g.k, g.w, g.bias, g.n, y, g.ldy);
  });
}

}  // namespace

namespace {

// The checks of Create common to CreateWithBf16Kernel.
absl::Status ValidateThreadsAndIsa(const CpuBackendOptions& options) {
  if (options.num_threads < 0 || options.num_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads must be in [0, 1024]; was ", options.num_threads));
  }
  if (!(options.min_flops_per_thread >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_flops_per_thread must be >= 0; was ", options.min_flops_per_thread));
  }
  if (!CpuSupports(options.isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("isa ", IsaName(options.isa), " is not supported by this CPU"));
  }
  return absl::OkStatus();
}

int ThreadsOf(const CpuBackendOptions& options) {
  if (options.num_threads != 0) return options.num_threads;
  return AvailableCores();
}

Isa IsaOf(const CpuBackendOptions& options) {
  return options.isa == Isa::kAuto ? BestIsa() : options.isa;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const CpuBackendOptions& options) {
  if (absl::Status s = ValidateThreadsAndIsa(options); !s.ok()) return s;
  if (!CpuSupports(options.bf16_isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("bf16_isa ", Bf16IsaName(options.bf16_isa), " is not supported by this CPU"));
  }
  const Bf16Isa bf16_isa = options.bf16_isa == Bf16Isa::kAuto ? BestBf16Isa() : options.bf16_isa;
  SetBlasSingleThreaded();
  return std::unique_ptr<CpuBackend>(
      new CpuBackend(options, KernelFor(IsaOf(options)), bf16_isa,
                     bf16_isa == Bf16Isa::kNone ? nullptr : &Bf16KernelFor(bf16_isa)));
}

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::CreateWithBf16Kernel(
    const CpuBackendOptions& options, const Bf16AttentionKernel& bf16_kernel) {
  if (absl::Status s = ValidateThreadsAndIsa(options); !s.ok()) return s;
  if (options.bf16_isa != Bf16Isa::kAuto && options.bf16_isa != bf16_kernel.isa) {
    return absl::InvalidArgumentError(
        absl::StrCat("bf16_isa must be auto or the kernel's (", Bf16IsaName(bf16_kernel.isa),
                     " for ", bf16_kernel.name, "); was ", Bf16IsaName(options.bf16_isa)));
  }
  if (!CpuSupports(Bf16Isa::kAvx512Bf16)) {
    return absl::FailedPreconditionError(absl::StrCat("the 16-bit kernel ", bf16_kernel.name,
                                                      " needs AVX512_BF16, which this CPU lacks"));
  }
  SetBlasSingleThreaded();
  return std::unique_ptr<CpuBackend>(
      new CpuBackend(options, KernelFor(IsaOf(options)), bf16_kernel.isa, &bf16_kernel));
}

CpuBackend::CpuBackend(const CpuBackendOptions& options, const AttentionKernel& kernel,
                       Bf16Isa bf16_isa, const Bf16AttentionKernel* bf16_kernel)
    : kernel_(kernel),
      paged_kernel_(PagedKernelFor(kernel.isa, bf16_isa != Bf16Isa::kNone)),
      bf16_isa_(bf16_isa),
      bf16_kernel_(bf16_kernel),
      float32_as_bf16_(options.float32_as_bf16),
      min_flops_per_thread_(options.min_flops_per_thread),
      pool_(ThreadsOf(options)) {}

bool CpuBackend::ComputesInBf16(DType dtype) const {
  if (bf16_kernel_ == nullptr) return false;
  return dtype == DType::kBFloat16 || float32_as_bf16_;
}

std::string CpuBackend::float32_precision() const {
  if (float32_as_bf16_ && bf16_kernel_ != nullptr) {
    return absl::StrCat("bf16: bfloat16 operands, float32 accumulation (", bf16_kernel_->name, ")");
  }
  return "fp32: float32 arithmetic";
}

std::vector<DeviceInfo> CpuBackend::devices() const {
  const int64_t pages = sysconf(_SC_PHYS_PAGES);
  const int64_t page_size = sysconf(_SC_PAGESIZE);
  return {DeviceInfo{absl::StrCat("cpu: ", CpuModelName(), " (", num_threads(), " threads, ",
                                  kernel_.name, ", bf16 ", Bf16IsaName(bf16_isa_), ")"),
                     pages > 0 && page_size > 0 ? pages * page_size : 0}};
}

void CpuBackend::RunAttention(absl::Span<const AttentionParams> batch) {
  // Items on the bfloat16 path get their K and V packed first, one task per (b, kv head), into
  // one buffer per call (O(B·Hkv·Lk·(D + Dv)) bytes: the size of K and V in bfloat16).
  std::vector<PackTask> packs;
  std::vector<int64_t> pack_offset(batch.size(), -1);
  int64_t pack_bytes = 0;
  for (int item = 0; item < static_cast<int>(batch.size()); ++item) {
    const AttentionParams& p = batch[item];
    // ScoreMods (windows, soft-capping, ALiBi) are in the float32 kernel only, for now; linear
    // attention has its own (linear_attention.h).
    if (p.weights != nullptr || p.head_dim > kMaxBf16HeadDim || p.v_head_dim > kMaxBf16HeadDim ||
        !ComputesInBf16(p.input_dtype) || p.mods.any() || p.kind == AttentionKind::kLinear) {
      continue;
    }
    pack_offset[item] = pack_bytes;
    pack_bytes += int64_t{p.batch} * p.num_kv_heads * bf16_kernel_->packed_bytes(p);
  }
  ScratchBuffer packed(ScratchUse::kPackedKv, pack_bytes);
  auto packed_of = [&](int item, int b, int kvh) -> char* {
    const AttentionParams& p = batch[item];
    return packed.data() + pack_offset[item] +
           (int64_t{b} * p.num_kv_heads + kvh) * bf16_kernel_->packed_bytes(p);
  };

  std::vector<AttentionTask> tasks;
  double flops = 0;  // for ThreadsFor: every key counted (masks, windows and causality ignored)
  for (int item = 0; item < static_cast<int>(batch.size()); ++item) {
    const AttentionParams& p = batch[item];
    const double heads = static_cast<double>(p.batch) * p.num_heads;
    if (p.kind == AttentionKind::kLinear) {  // one task per (b, h): i0 = -1 marks them
      // φ(K)ᵀV, then φ(Q)·that: D·Dv per key and per query.
      flops += 2.0 * heads * (p.q_len + p.kv_len) * p.head_dim * p.v_head_dim;
      for (int b = 0; b < p.batch; ++b) {
        for (int h = 0; h < p.num_heads; ++h)
          tasks.push_back(AttentionTask{item, b, h, -1, nullptr});
      }
      continue;
    }
    flops += 2.0 * heads * p.q_len * p.kv_len * (p.head_dim + p.v_head_dim);  // Q·Kᵀ, P·V
    const bool bf16 = pack_offset[item] >= 0;
    const int blocks = (p.q_len + kQueryBlock - 1) / kQueryBlock;
    for (int b = 0; b < p.batch; ++b) {
      if (bf16) {
        for (int kvh = 0; kvh < p.num_kv_heads; ++kvh) {
          packs.push_back(PackTask{item, b, kvh, packed_of(item, b, kvh)});
        }
      }
      for (int h = 0; h < p.num_heads; ++h) {
        const void* kv = bf16 ? packed_of(item, b, h / p.group_size()) : nullptr;
        for (int blk = 0; blk < blocks; ++blk) {
          // Causal blocks get heavier with the row index: queue the heavy ones first so the
          // pool's dynamic scheduling ends evenly. (Order only; results do not depend on it.)
          const int block = p.causal ? blocks - 1 - blk : blk;
          tasks.push_back(AttentionTask{item, b, h, block * kQueryBlock, kv});
        }
      }
    }
  }
  // The packing's threads follow the attention's: it is a small part of the same step.
  const int threads = ThreadsFor(flops);
  if (!packs.empty()) {
    pool_.ParallelFor(static_cast<int64_t>(packs.size()), threads, [&](int64_t t) {
      const PackTask& task = packs[t];
      bf16_kernel_->pack(batch[task.item], task.b, task.kvh, task.packed);
    });
  }
  pool_.ParallelFor(static_cast<int64_t>(tasks.size()), threads, [&](int64_t t) {
    const AttentionTask& task = tasks[t];
    const AttentionParams& p = batch[task.item];
    if (task.i0 < 0) {
      LinearAttentionHead(p, task.b, task.h);
    } else if (task.packed != nullptr) {
      ScratchBuffer scratch(ScratchUse::kTask,
                            bf16_kernel_->scratch_bytes(p.head_dim, p.v_head_dim));
      bf16_kernel_->run(p, task.b, task.h, task.i0, task.packed, scratch.data());
    } else {
      ScratchBuffer scratch(ScratchUse::kTask,
                            kernel_.scratch_floats(p.head_dim, p.v_head_dim) * int64_t{4});
      kernel_.run(p, task.b, task.h, task.i0, scratch.floats());
    }
  });
}

int CpuBackend::ThreadsFor(double flops) const {
  const int all = pool_.num_threads();
  if (min_flops_per_thread_ == 0) return all;
  return static_cast<int>(std::clamp<double>(flops / min_flops_per_thread_, 1, all));
}

absl::Status CpuBackend::Attend(absl::Span<const AttentionParams> batch) {
  RunAttention(batch);
  return absl::OkStatus();
}

int64_t CpuBackend::ReleaseIdleMemory() { return ReleaseIdleScratch(); }

absl::Status CpuBackend::MultiHead(absl::Span<const MultiHeadParams> batch) {
  // Per-request intermediates: the projected Q, K, V in [B, L, h, d_k] layout (attention reads
  // the heads through strides; bfloat16 on the 16-bit path, else float32) and the concatenated
  // heads (float32), all in the thread's kMultiHead scratch (scratch.h), each part 64-byte
  // aligned.
  // Left uninitialised: every element is written before it is read.
  struct Buffers {
    int64_t qkv = 0;     // self-attention: [B·L, 3·d_model]; else Q [B·Lq, d_model]
    int64_t kv = 0;      // cross-attention: K and V, [B·Lk, 2·d_model]
    int64_t concat = 0;  // [B·Lq, d_model] float32
  };
  std::vector<Buffers> buffers(batch.size());
  int64_t total = 0;
  auto take = [&total](int64_t bytes) {
    const int64_t at = total;
    total += (bytes + 63) / 64 * 64;
    return at;
  };
  for (size_t r = 0; r < batch.size(); ++r) {
    const MultiHeadParams& p = batch[r];
    const int64_t dm = p.module->d_model;
    const int64_t esize = ComputesInBf16(p.input_dtype) ? 2 : 4;
    const int64_t q_rows = int64_t{p.batch} * p.q_len;
    const int64_t kv_rows = int64_t{p.batch} * p.kv_len;
    buffers[r].qkv = take(q_rows * (p.self_attention ? 3 : 1) * dm * esize);
    if (!p.self_attention) buffers[r].kv = take(kv_rows * 2 * dm * esize);
    buffers[r].concat = take(q_rows * dm * 4);
  }
  ScratchBuffer intermediates(ScratchUse::kMultiHead, total);
  char* const base = intermediates.data();
  std::vector<AttentionParams> attention(batch.size());
  std::vector<GemmTask> projections;
  std::vector<GemmTask> outputs;

  for (size_t r = 0; r < batch.size(); ++r) {
    const MultiHeadParams& p = batch[r];
    const MultiHeadWeights& w = *p.module;
    const int dm = w.d_model;
    const int64_t d2 = int64_t{dm} * dm;
    const int64_t q_rows = int64_t{p.batch} * p.q_len;
    const int64_t kv_rows = int64_t{p.batch} * p.kv_len;
    const bool bf16 = ComputesInBf16(p.input_dtype);
    const DType proj_type = bf16 ? DType::kBFloat16 : DType::kFloat32;
    const int64_t esize = static_cast<int64_t>(DTypeSize(proj_type));
    const uint16_t* w16 = bf16 ? w.w_qkv_bf16().data() : nullptr;
    const DType t = p.input_dtype;
    Buffers& buf = buffers[r];
    ProjectedQkv qkv;
    qkv.dtype = proj_type;
    if (p.self_attention) {
      // One GEMM for Q, K and V: w_qkv is [3·d_model, d_model], the rows of W_q, W_k, W_v.
      char* y = base + buf.qkv;
      AddGemm(p.query, t, dm, q_rows, dm, w.w_qkv.data(), w16, w.b_qkv.data(), 3 * dm, y, proj_type,
              3 * dm, &projections);
      qkv.q = y;
      qkv.k = y + dm * esize;
      qkv.v = y + 2 * dm * esize;
      qkv.q_ld = qkv.k_ld = qkv.v_ld = 3 * dm;
    } else {
      char* yq = base + buf.qkv;
      char* ykv = base + buf.kv;
      AddGemm(p.query, t, dm, q_rows, dm, w.w_q(), w16, w.b_q(), dm, yq, proj_type, dm,
              &projections);
      if (p.key == p.value) {
        // W_k and W_v are adjacent in w_qkv: one GEMM for both.
        AddGemm(p.key, t, dm, kv_rows, dm, w.w_k(), w16 != nullptr ? w16 + d2 : nullptr, w.b_k(),
                2 * dm, ykv, proj_type, 2 * dm, &projections);
      } else {
        AddGemm(p.key, t, dm, kv_rows, dm, w.w_k(), w16 != nullptr ? w16 + d2 : nullptr, w.b_k(),
                dm, ykv, proj_type, 2 * dm, &projections);
        AddGemm(p.value, t, dm, kv_rows, dm, w.w_v(), w16 != nullptr ? w16 + 2 * d2 : nullptr,
                w.b_v(), dm, ykv + dm * esize, proj_type, 2 * dm, &projections);
      }
      qkv.q = yq;
      qkv.q_ld = dm;
      qkv.k = ykv;
      qkv.v = ykv + dm * esize;
      qkv.k_ld = qkv.v_ld = 2 * dm;
    }
    float* concat = reinterpret_cast<float*>(base + buf.concat);
    attention[r] = HeadAttentionParams(p, qkv, concat, dm);
    AddGemm(concat, DType::kFloat32, dm, q_rows, dm, w.w_o.data(),
            bf16 ? w.w_o_bf16().data() : nullptr, w.b_o.data(), dm, p.out, DType::kFloat32, dm,
            &outputs);
  }

  RunGemms(pool_, ThreadsFor(GemmFlops(projections)), bf16_kernel_, projections);
  RunAttention(attention);
  RunGemms(pool_, ThreadsFor(GemmFlops(outputs)), bf16_kernel_, outputs);
  return absl::OkStatus();
}

absl::Status CpuBackend::Project(absl::Span<const ProjectionParams> batch) {
  std::vector<GemmTask> tasks;
  for (const ProjectionParams& p : batch) {
    const MultiHeadWeights& w = *p.module;
    const bool bf16 = ComputesInBf16(p.request_dtype);
    const uint16_t* w16 = nullptr;
    if (bf16) {
      w16 = p.weights == ProjectionParams::Weights::kQkv ? w.w_qkv_bf16().data()
                                                         : w.w_o_bf16().data();
    }
    AddGemm(p.x, p.x_type, w.d_model, p.rows, w.d_model, p.w(), w16, p.bias(), p.n(), p.y,
            DType::kFloat32, p.n(), &tasks);
  }
  RunGemms(pool_, ThreadsFor(GemmFlops(tasks)), bf16_kernel_, tasks);
  return absl::OkStatus();
}

}  // namespace attnserve::kernels::cpu
