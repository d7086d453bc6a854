#include "kernels/cpu/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/projection.h"

namespace attnserve::kernels::cpu {
namespace {

// One attention task: rows [i0, i0 + kQueryBlock) of (b, h) of batch item `item`.
struct AttentionTask {
  int item;
  int b;
  int h;
  int i0;
};

// One projection task: y = x · wᵀ + bias over `rows` rows (see Linear); x of element type
// x_type, widened to float32 by the task when it is 16-bit.
struct GemmTask {
  const void* x;
  DType x_type;
  int64_t ldx;
  int64_t rows;
  int k;
  const float* w;
  const float* bias;
  int n;
  float* y;
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

// Appends the tasks of one projection, cut into chunks of GemmRowChunk(rows) rows.
void AddGemm(const void* x, DType x_type, int64_t ldx, int64_t rows, int k, const float* w,
             const float* bias, int n, float* y, int64_t ldy, std::vector<GemmTask>* tasks) {
  const int64_t chunk = GemmRowChunk(rows);
  const size_t esize = DTypeSize(x_type);
  for (int64_t r = 0; r < rows; r += chunk) {
    tasks->push_back(GemmTask{static_cast<const char*>(x) + r * ldx * esize, x_type, ldx,
                              std::min<int64_t>(chunk, rows - r), k, w, bias, n, y + r * ldy, ldy});
  }
}

// A 64-byte aligned scratch buffer per thread, grown on demand and kept for the next call.
// Attention tasks and projection tasks run in separate phases and never hold it at once.
float* ThreadScratch(int64_t floats) {
  struct Buffer {
    float* data = nullptr;
    int64_t size = 0;
    ~Buffer() { ::operator delete[](data, std::align_val_t{64}); }
  };
  thread_local Buffer buffer;
  if (buffer.size < floats) {
    ::operator delete[](buffer.data, std::align_val_t{64});
    buffer.data = static_cast<float*>(
        ::operator new[](static_cast<size_t>(floats) * sizeof(float), std::align_val_t{64}));
    buffer.size = floats;
  }
  return buffer.data;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const CpuBackendOptions& options) {
  if (options.num_threads < 0 || options.num_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads must be in [0, 1024]; was ", options.num_threads));
  }
  if (!CpuSupports(options.isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("isa ", IsaName(options.isa), " is not supported by this CPU"));
  }
  int threads = options.num_threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  const Isa isa = options.isa == Isa::kAuto ? BestIsa() : options.isa;
  SetBlasSingleThreaded();
  return std::unique_ptr<CpuBackend>(new CpuBackend(threads, KernelFor(isa)));
}

CpuBackend::CpuBackend(int num_threads, const AttentionKernel& kernel)
    : kernel_(kernel), pool_(num_threads) {}

std::vector<DeviceInfo> CpuBackend::devices() const {
  const int64_t pages = sysconf(_SC_PHYS_PAGES);
  const int64_t page_size = sysconf(_SC_PAGESIZE);
  return {DeviceInfo{
      absl::StrCat("cpu: ", CpuModelName(), " (", num_threads(), " threads, ", kernel_.name, ")"),
      pages > 0 && page_size > 0 ? pages * page_size : 0}};
}

void CpuBackend::RunAttention(absl::Span<const AttentionParams> batch) {
  std::vector<AttentionTask> tasks;
  for (int item = 0; item < static_cast<int>(batch.size()); ++item) {
    const AttentionParams& p = batch[item];
    const int blocks = (p.q_len + kQueryBlock - 1) / kQueryBlock;
    for (int b = 0; b < p.batch; ++b) {
      for (int h = 0; h < p.num_heads; ++h) {
        for (int blk = 0; blk < blocks; ++blk) {
          // Causal blocks get heavier with the row index: queue the heavy ones first so the
          // pool's dynamic scheduling ends evenly. (Order only; results do not depend on it.)
          const int block = p.causal ? blocks - 1 - blk : blk;
          tasks.push_back(AttentionTask{item, b, h, block * kQueryBlock});
        }
      }
    }
  }
  pool_.ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t t) {
    const AttentionTask& task = tasks[t];
    const AttentionParams& p = batch[task.item];
    float* scratch = ThreadScratch(kernel_.scratch_floats(p.head_dim, p.v_head_dim));
    kernel_.run(p, task.b, task.h, task.i0, scratch);
  });
}

absl::Status CpuBackend::Attend(absl::Span<const AttentionParams> batch) {
  RunAttention(batch);
  return absl::OkStatus();
}

absl::Status CpuBackend::MultiHead(absl::Span<const MultiHeadParams> batch) {
  // Per-request intermediates: the projected Q, K, V in [B, L, h, d_k] layout (attention reads
  // the heads through strides) and the concatenated heads.
  // Left uninitialised (make_unique_for_overwrite): every element is written before it is read.
  struct Buffers {
    std::unique_ptr<float[]> qkv;     // self-attention: [B·L, 3·d_model]; else Q [B·Lq, d_model]
    std::unique_ptr<float[]> kv;      // cross-attention: K and V, [B·Lk, 2·d_model]
    std::unique_ptr<float[]> concat;  // [B·Lq, d_model]
  };
  std::vector<Buffers> buffers(batch.size());
  std::vector<AttentionParams> attention(batch.size());
  std::vector<GemmTask> projections;
  std::vector<GemmTask> outputs;

  for (size_t r = 0; r < batch.size(); ++r) {
    const MultiHeadParams& p = batch[r];
    const MultiHeadWeights& w = *p.module;
    const int dm = w.d_model;
    const int dk = w.head_dim();
    const int64_t q_rows = int64_t{p.batch} * p.q_len;
    const int64_t kv_rows = int64_t{p.batch} * p.kv_len;
    Buffers& buf = buffers[r];
    AttentionParams& a = attention[r];
    a.batch = p.batch;
    a.num_heads = a.num_kv_heads = w.num_heads;
    a.q_len = p.q_len;
    a.kv_len = p.kv_len;
    a.head_dim = a.v_head_dim = dk;
    a.weights = p.weights;
    a.mask = p.mask;
    a.causal = p.causal;
    a.key_lengths = p.key_lengths;
    a.scale = p.scale;

    // A [B, L, h, d_k] view into a projection buffer of row stride `ld`: head t at column t·d_k.
    auto view = [&](const float* data, int64_t len, int64_t ld) {
      return InputView{data, len * ld, dk, ld};
    };
    if (p.self_attention) {
      // One GEMM for Q, K and V: w_qkv is [3·d_model, d_model], the rows of W_q, W_k, W_v.
      buf.qkv = std::make_unique_for_overwrite<float[]>(q_rows * 3 * dm);
      AddGemm(p.query, p.input_dtype, dm, q_rows, dm, w.w_qkv.data(), w.b_qkv.data(), 3 * dm,
              buf.qkv.get(), 3 * dm, &projections);
      a.q = view(buf.qkv.get(), p.q_len, 3 * dm);
      a.k = view(buf.qkv.get() + dm, p.kv_len, 3 * dm);
      a.v = view(buf.qkv.get() + 2 * dm, p.kv_len, 3 * dm);
    } else {
      buf.qkv = std::make_unique_for_overwrite<float[]>(q_rows * dm);
      buf.kv = std::make_unique_for_overwrite<float[]>(kv_rows * 2 * dm);
      const DType t = p.input_dtype;
      AddGemm(p.query, t, dm, q_rows, dm, w.w_q(), w.b_q(), dm, buf.qkv.get(), dm, &projections);
      if (p.key == p.value) {
        // W_k and W_v are adjacent in w_qkv: one GEMM for both.
        AddGemm(p.key, t, dm, kv_rows, dm, w.w_k(), w.b_k(), 2 * dm, buf.kv.get(), 2 * dm,
                &projections);
      } else {
        AddGemm(p.key, t, dm, kv_rows, dm, w.w_k(), w.b_k(), dm, buf.kv.get(), 2 * dm,
                &projections);
        AddGemm(p.value, t, dm, kv_rows, dm, w.w_v(), w.b_v(), dm, buf.kv.get() + dm, 2 * dm,
                &projections);
      }
      a.q = view(buf.qkv.get(), p.q_len, dm);
      a.k = view(buf.kv.get(), p.kv_len, 2 * dm);
      a.v = view(buf.kv.get() + dm, p.kv_len, 2 * dm);
    }
    buf.concat = std::make_unique_for_overwrite<float[]>(q_rows * dm);
    a.out = StridedView<float>{buf.concat.get(), int64_t{p.q_len} * dm, dk, dm};
    AddGemm(buf.concat.get(), DType::kFloat32, dm, q_rows, dm, w.w_o.data(), w.b_o.data(), dm,
            p.out, dm, &outputs);
  }

  auto run_gemms = [&](const std::vector<GemmTask>& tasks) {
    pool_.ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t t) {
      const GemmTask& g = tasks[t];
      if (g.x_type == DType::kFloat32) {
        Linear(static_cast<const float*>(g.x), g.ldx, g.rows, g.k, g.w, g.bias, g.n, g.y, g.ldy);
        return;
      }
      // 16-bit inputs: this chunk's rows widened (exactly) into the thread's scratch.
      float* x = ThreadScratch(g.rows * g.k);
      const size_t esize = DTypeSize(g.x_type);
      for (int64_t r = 0; r < g.rows; ++r) {
        ToFloat32(g.x_type, static_cast<const char*>(g.x) + r * g.ldx * esize, g.k, x + r * g.k);
      }
      Linear(x, g.k, g.rows, g.k, g.w, g.bias, g.n, g.y, g.ldy);
    });
  };
  run_gemms(projections);
  RunAttention(attention);
  run_gemms(outputs);
  return absl::OkStatus();
}

}  // namespace attnserve::kernels::cpu
