// The CUDA attention kernels of kernels/cuda/ (flash forward hdim64/hdim128 in fp16 and bf16,
// and the generic kernel), compiled as host C++ and executed by the emulator (emu.h), against
// the float64 reference (kernels/reference.h), on every option: odd lengths, Lq = 1, causal
// with Lq > Lk, key lengths, mask layouts (fully blocked rows and tiles), GQA, mixed-length
// packs, D != Dv, and the NaN rule (attention_params.h); sliding windows, soft-capping and ALiBi
// on every kernel (the tensor-core kernel's kMods instantiations). Each case runs with cp.async
// landing at issue and at the wait (emu::CpAsyncMode).
//
// The launches are flash_emu_kernels.cc's: this file holds the cases and includes no kernel
// body, so that each mutant (make_mutant.sh) links it as it is and compiles only the kernels.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/cuda/flash_decode_shape.h"
#include "kernels/cuda/flash_grid.h"
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/kernel_traits.h"
#include "kernels/reference.h"
#include "tests/cuda_emu/attention_case.h"
#include "tests/cuda_emu/emu.h"
#include "tests/cuda_emu/flash_emu_kernels.h"

namespace attnserve::kernels::cuda {
namespace {

// P.V on the tensor-core paths (2^-11 relative in fp16, 2^-8 in bf16); the generic kernel keeps
// P in float32.
double Tolerance(Kernel kernel, ComputeType type) {
  if (kernel == Kernel::kGeneric || kernel == Kernel::kDecode) return 2e-5;
  return type == ComputeType::kFloat16 ? 2e-3 : 1.2e-2;
}

void ExpectMatches(const Case& c, Kernel kernel, ComputeType type, const Outcome& r) {
  ExpectMatches(c, KernelName(kernel) + " " + ComputeTypeName(type), Tolerance(kernel, type), r);
}

Outcome RunCase(const Case& c, Kernel kernel, ComputeType type, uint32_t seed) {
  return RunCase(c, type, seed, [&](const FlashFwdParams& p) {
    LaunchKernel(kernel, type, p);
    return std::vector<float>();
  });
}

struct Param {
  Kernel kernel;
  ComputeType type;
  emu::CpAsyncMode mode;
};

std::string ParamName(const testing::TestParamInfo<Param>& info) {
  return KernelName(info.param.kernel) + "_" + ComputeTypeName(info.param.type) +
         (info.param.mode == emu::CpAsyncMode::kLandAtIssue ? "_LandAtIssue" : "_LandAtWait");
}

class FlashEmuTest : public testing::TestWithParam<Param> {
 protected:
  void SetUp() override { emu::SetCpAsyncMode(GetParam().mode); }
  // The head dims of the kernel under test: the padded width itself (hdim 64, 128), or
  // D, Dv below it and different (the zero padding of q and k, of v, or of both); the generic
  // kernel takes D != Dv, not multiples of 8.
  Case Base(const std::string& name) const {
    Case c;
    c.name = name;
    switch (GetParam().kernel) {
      case Kernel::kHdim32:
        c.head_dim = 24;
        c.v_head_dim = 32;
        break;
      case Kernel::kHdim96:
        c.head_dim = 96;
        c.v_head_dim = 72;
        break;
      case Kernel::kHdim160:
        c.head_dim = 152;
        c.v_head_dim = 136;
        break;
      case Kernel::kHdim192:
        c.head_dim = 176;
        c.v_head_dim = 192;
        break;
      case Kernel::kHdim256:
        c.head_dim = 256;
        c.v_head_dim = 208;
        break;
      case Kernel::kGeneric:
        c.head_dim = 40;
        c.v_head_dim = 72;
        break;
      case Kernel::kHdim64:
      case Kernel::kHdim128:
        c.head_dim = c.v_head_dim = TensorCoreDim(GetParam().kernel);
        break;
      case Kernel::kDecode:  // FlashDecodeEmuTest covers it; AllParams() never names it
        ADD_FAILURE() << "FlashEmuTest is not instantiated for the decode kernel";
        break;
    }
    return c;
  }
  Outcome Check(const Case& c, uint32_t seed = 1) {
    const Outcome r = RunCase(c, GetParam().kernel, GetParam().type, seed);
    ExpectMatches(c, GetParam().kernel, GetParam().type, r);
    return r;
  }
};

// Odd lengths (partial query and key tiles), Lq = 1, and a mixed-length pack with a sequence
// of 1 x 1 and one with no queries.
TEST_P(FlashEmuTest, OddLengthsDecodeAndMixedPacks) {
  Case c = Base("odd");
  c.seqs = {{77, 133}};
  Check(c);
  c = Base("decode");
  c.seqs = {{1, 150}};
  Check(c);
  c = Base("pack");
  c.seqs = {{1, 1}, {20, 70}, {0, 5}, {66, 9}};
  Check(c);
}

// Causal (bottom-right aligned) with Lq < Lk and Lq > Lk: the first Lq - Lk rows have no
// allowed key and attend uniformly.
TEST_P(FlashEmuTest, Causal) {
  Case c = Base("causal");
  c.seqs = {{70, 150}, {90, 37}};
  c.causal = true;
  Check(c);
}

// Key lengths Lk, 0 (every row blocked), 1 and odd, with causal on the last pack.
TEST_P(FlashEmuTest, KeyLengths) {
  Case c = Base("key_lengths");
  c.seqs = {{17, 90}, {17, 90}, {17, 90}, {17, 90}};
  c.key_lengths = {90, 0, 1, 45};
  Check(c);
  c.causal = true;
  c.name = "key_lengths_causal";
  Check(c);
}

TEST_P(FlashEmuTest, MaskLayouts) {
  for (MaskLayout m : kMaskLayouts) {
    Case c = Base("mask" + std::to_string(static_cast<int>(m)));
    // 81 keys: mask rows (and the second sequence's mask) start at every byte offset within a
    // word, which the tensor-core kernel's word copies of the mask tile must undo.
    c.seqs = m == MaskLayout::kBlockedTiles ? std::vector<Seq>{{20, 301}}
                                            : std::vector<Seq>{{20, 81}, {9, 33}};
    c.mask = m;
    c.causal = m == MaskLayout::kPerHead;
    Check(c);
  }
}

// Grouped-query attention: 4 query heads on 2 and on 1 key/value heads.
TEST_P(FlashEmuTest, GroupedQueryAttention) {
  Case c = Base("gqa_4_2");
  c.seqs = {{19, 40}};
  c.num_heads = 4;
  c.num_kv_heads = 2;
  Check(c);
  c.name = "gqa_4_1";
  c.num_kv_heads = 1;
  c.causal = true;
  Check(c);
}

// The NaN rule (attention_params.h), each on one head of one sequence.
TEST_P(FlashEmuTest, NaNRule) {
  ExpectNaNRule(
      Base(""), [&](const Case& c) { return Check(c); },
      [&](const Case& c) { return RunCase(c, GetParam().kernel, GetParam().type, 1); });
}

// The launch grid (flash_grid.h) covers every (m block, head, sequence) exactly once, past
// grid y's 65535 limit on heads.
TEST(FlashGridTest, EveryBlockOnceBeyond65535Heads) {
  for (const auto& [m_blocks, seqs, heads] :
       std::vector<std::tuple<int, int, int>>{{1, 1, 65536}, {3, 2, 70001}, {5, 7, 3}}) {
    const int64_t blocks = FlashGridBlocks(m_blocks, seqs, heads);
    ASSERT_EQ(blocks, int64_t{m_blocks} * seqs * heads);
    std::vector<uint8_t> seen(static_cast<size_t>(blocks), 0);
    for (int64_t b = 0; b < blocks; ++b) {
      const FlashBlockCoord c = FlashBlockOf(static_cast<unsigned>(b), m_blocks, heads);
      ASSERT_TRUE(c.m_block >= 0 && c.m_block < m_blocks && c.head >= 0 && c.head < heads &&
                  c.seq >= 0 && c.seq < seqs);
      uint8_t& s = seen[(size_t(c.seq) * heads + c.head) * m_blocks + c.m_block];
      ASSERT_EQ(s, 0) << "block " << b << " computed twice";
      s = 1;
    }
  }
}

// q/k/v [1, 65536, 1, 8] (65536 heads, the review's case): the generic kernel's blocks of the
// first and last heads compute them (only those blocks are emulated; the rest stay unwritten).
TEST(FlashGridTest, SixtyFiveThousandHeads) {
  const int kHeads = 65536, kD = 8;
  std::mt19937 rng(3);
  Buffer16 q = MakeBuffer(size_t(kHeads) * kD, ComputeType::kFloat16, rng, -1, 1);
  Buffer16 k = MakeBuffer(size_t(kHeads) * kD, ComputeType::kFloat16, rng, -1, 1);
  Buffer16 v = MakeBuffer(size_t(kHeads) * kD, ComputeType::kFloat16, rng, -1, 1);
  std::vector<float> o(size_t(kHeads) * kD, -12345.0f);
  const int cu[2] = {0, 1};
  FlashFwdParams p;
  p.q = q.bits.get();
  p.k = k.bits.get();
  p.v = v.bits.get();
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = int64_t{kHeads} * kD;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = kD;
  p.o = o.data();
  p.cu_seqlens_q = cu;
  p.cu_seqlens_k = cu;
  p.num_seqs = 1;
  p.max_seqlen_q = 1;
  p.num_heads = p.num_kv_heads = kHeads;
  p.head_dim = p.v_head_dim = kD;
  p.scale = 0.5f;
  p.scale_log2 = 0.5f * kLog2e;
  const std::vector<int> checked = {0, 1, 65534, 65535};
  emu::SetBlockFilter([&](const uint3& b) {
    const FlashBlockCoord c = FlashBlockOf(b.x, 1, kHeads);
    return std::find(checked.begin(), checked.end(), c.head) != checked.end();
  });
  LaunchKernel(Kernel::kGeneric, ComputeType::kFloat16, p);
  emu::SetBlockFilter(nullptr);
  // One key: softmax weight 1, the output is v of the head's key.
  for (int h : checked) {
    for (int d = 0; d < kD; ++d) {
      EXPECT_EQ(o[size_t(h) * kD + d], v.values[size_t(h) * kD + d]) << h << " " << d;
    }
  }
  EXPECT_EQ(o[size_t(2) * kD], -12345.0f);  // not emulated
}

// Sliding windows, soft-capping and ALiBi (ScoreMods) on the generic kernel and the tensor-core
// kernel's kMods instantiations: each one alone and all together, against the float64
// reference. The windows are small against the lengths so that a bound one key off moves many
// rows; the window starts cross the kernels' key blocks (32 keys in the generic kernel, 16 to
// 128 in the tensor-core ones: whole blocks before them are skipped, and with a mask its first
// tile is copied from that block on).
class FlashModsEmuTest : public FlashEmuTest {};

TEST_P(FlashModsEmuTest, WindowSoftcapAndAlibi) {
  Case c = Base("causal_window");
  c.seqs = {{40, 150}, {1, 70}, {66, 66}};
  c.causal = true;
  c.mods.window_left = 33;
  c.mods.window_right = 0;
  Check(c);
  c = Base("two_sided_window");
  c.seqs = {{50, 90}};
  c.mods.window_left = 5;
  c.mods.window_right = 3;
  Check(c);
  c = Base("softcap");
  c.seqs = {{20, 45}};
  c.mods.softcap = 0.75f;  // well below the scores' spread: the cap changes every row
  Check(c);
  c = Base("alibi");
  c.seqs = {{20, 45}, {1, 9}};
  c.num_heads = 4;
  c.slopes = {0.5f, 0.25f, 0.125f, 0.0625f};  // a different slope on each head
  Check(c);
  c = Base("together");
  c.seqs = {{30, 100}};
  c.causal = true;
  c.key_lengths = {90};
  c.mods = {.window_left = 40, .window_right = -1, .softcap = 1.5f};
  c.slopes = {0.25f, 1.0f};
  Check(c);
  // Windows that start one and more 128-key blocks in, over two query blocks of 64 rows, with a
  // mask (its first tile copied from the first block in the window).
  c = Base("long_window_mask");
  c.seqs = {{70, 300}, {9, 81}};
  c.causal = true;
  c.mask = MaskLayout::kPerHead;
  c.mods = {.window_left = 100, .window_right = 0};
  Check(c);
}

// The generic kernel, and each tensor-core head dim once (one type and one mode each,
// alternating; hdim 64 and 128 in both): the kMods instantiations differ in key block (128 at
// hdim 32, 64 up to 128, 32 at 160, 16 above) and in where Q is kept (kernel_traits.h).
INSTANTIATE_TEST_SUITE_P(
    Kernels, FlashModsEmuTest,
    testing::Values(Param{Kernel::kGeneric, ComputeType::kFloat16, emu::CpAsyncMode::kLandAtIssue},
                    Param{Kernel::kGeneric, ComputeType::kBFloat16, emu::CpAsyncMode::kLandAtWait},
                    Param{Kernel::kHdim32, ComputeType::kFloat16, emu::CpAsyncMode::kLandAtWait},
                    Param{Kernel::kHdim64, ComputeType::kFloat16, emu::CpAsyncMode::kLandAtIssue},
                    Param{Kernel::kHdim64, ComputeType::kBFloat16, emu::CpAsyncMode::kLandAtWait},
                    Param{Kernel::kHdim96, ComputeType::kBFloat16, emu::CpAsyncMode::kLandAtIssue},
                    Param{Kernel::kHdim128, ComputeType::kFloat16, emu::CpAsyncMode::kLandAtWait},
                    Param{Kernel::kHdim128, ComputeType::kBFloat16, emu::CpAsyncMode::kLandAtIssue},
                    Param{Kernel::kHdim160, ComputeType::kFloat16, emu::CpAsyncMode::kLandAtIssue},
                    Param{Kernel::kHdim192, ComputeType::kBFloat16, emu::CpAsyncMode::kLandAtWait},
                    Param{Kernel::kHdim256, ComputeType::kFloat16, emu::CpAsyncMode::kLandAtWait}),
    ParamName);

// The decode-shaped path (flash_decode_kernel.h): Lq = 1, GQA heads packed into a block's rows,
// keys split in chunks of kDecodeSplitKeys and merged in order.
class FlashDecodeEmuTest : public testing::TestWithParam<ComputeType> {
 protected:
  Outcome Check(const Case& c, uint32_t seed = 1) {
    const Outcome r = RunCase(c, Kernel::kDecode, GetParam(), seed);
    ExpectMatches(c, Kernel::kDecode, GetParam(), r);
    return r;
  }
};

// Key counts around the split size (1, 255, 256, 257, 700), a sequence with no query, GQA 8/1.
TEST_P(FlashDecodeEmuTest, SplitBoundariesAndGqaPacking) {
  Case c;
  c.name = "decode_gqa8";
  c.seqs = {{1, 1}, {1, 255}, {1, 256}, {0, 40}, {1, 257}, {1, 700}};
  c.num_heads = 8;
  c.num_kv_heads = 1;
  Check(c);
  c.name = "decode_gqa1_d24";
  c.num_heads = c.num_kv_heads = 3;
  c.head_dim = c.v_head_dim = 24;
  Check(c);
}

// Causal (no effect at Lq = 1), key lengths {Lk, 0, 1, odd} over 2 splits, GQA 4/2, D = Dv = 128.
TEST_P(FlashDecodeEmuTest, KeyLengthsAndCausal) {
  Case c;
  c.name = "decode_key_lengths";
  c.seqs = {{1, 600}, {1, 600}, {1, 600}, {1, 600}};
  c.key_lengths = {600, 0, 1, 301};
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = c.v_head_dim = 128;
  c.causal = true;
  Check(c);
}

// Per-head masks (some heads of a group blocked entirely) and everything blocked; D != Dv.
TEST_P(FlashDecodeEmuTest, Masks) {
  for (MaskLayout m : {MaskLayout::kPerHead, MaskLayout::kKeyPadding, MaskLayout::kAllBlocked}) {
    Case c;
    c.name = "decode_mask" + std::to_string(static_cast<int>(m));
    c.seqs = {{1, 300}, {1, 17}};
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 40;
    c.v_head_dim = 72;
    c.mask = m;
    Check(c);
  }
}

// ScoreMods on decode steps: a window whose start falls inside the second split, soft-cap and
// ALiBi with GQA 4/2 (each query head of a group its own slope).
TEST_P(FlashDecodeEmuTest, ScoreMods) {
  Case c;
  c.name = "decode_mods";
  c.seqs = {{1, 600}, {1, 40}};
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.mods = {.window_left = 300, .window_right = -1, .softcap = 2.0f};
  c.slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  Check(c);
}

// The NaN rule: NaN/+Inf in q makes that head's row NaN; NaN in v poisons its column.
TEST_P(FlashDecodeEmuTest, NaNRule) {
  for (const float bad : {kNaN, kInf}) {
    Case c;
    c.name = "decode_q_nonfinite";
    c.seqs = {{1, 300}};
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.q_poison = bad;
    const Outcome r = Check(c);
    for (int d = 0; d < c.v_head_dim; ++d) {
      EXPECT_TRUE(std::isnan(r.out[d])) << d;                    // head 0
      EXPECT_TRUE(std::isfinite(r.out[c.v_head_dim + d])) << d;  // head 1
    }
  }
  Case c;
  c.name = "decode_v_nan";
  c.seqs = {{1, 300}};
  c.v_poison = kNaN;
  c.num_kv_heads = 1;
  const Outcome r = Check(c);
  for (size_t e = 0; e < r.out.size(); ++e) {
    EXPECT_EQ(std::isnan(r.out[e]), e % c.v_head_dim == 3) << e;
  }
}

// Batch invariance: a sequence's output bits are the same alone and packed after companions of
// other lengths (the split size is fixed, never derived from the batch).
TEST_P(FlashDecodeEmuTest, BatchInvariantBitwise) {
  Case alone;
  alone.name = "decode_alone";
  alone.seqs = {{1, 777}};
  alone.num_heads = 4;
  alone.num_kv_heads = 1;
  Case packed = alone;
  packed.name = "decode_packed";
  packed.seqs = {{1, 777}, {1, 3000}, {1, 5}};
  const Outcome a = Check(alone);
  const Outcome b = Check(packed);
  ASSERT_GE(b.out.size(), a.out.size());
  EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Types, FlashDecodeEmuTest,
                         testing::Values(ComputeType::kFloat16, ComputeType::kBFloat16),
                         [](const testing::TestParamInfo<ComputeType>& info) {
                           return std::string(ComputeTypeName(info.param));
                         });

std::vector<Param> AllParams() {
  std::vector<Param> all;
  // hdim 64 and 128 (and the generic kernel) in both types and both cp.async modes; the other
  // instantiations share their template body, so one type and one mode each, alternating,
  // keeps the added time modest (an emulated hdim 256 case is ~3x an hdim 32 one).
  for (Kernel k : {Kernel::kHdim64, Kernel::kHdim128}) {
    for (ComputeType t : {ComputeType::kFloat16, ComputeType::kBFloat16}) {
      for (auto m : {emu::CpAsyncMode::kLandAtIssue, emu::CpAsyncMode::kLandAtWait}) {
        all.push_back({k, t, m});
      }
    }
  }
  all.push_back({Kernel::kHdim32, ComputeType::kFloat16, emu::CpAsyncMode::kLandAtWait});
  all.push_back({Kernel::kHdim96, ComputeType::kBFloat16, emu::CpAsyncMode::kLandAtIssue});
  all.push_back({Kernel::kHdim160, ComputeType::kFloat16, emu::CpAsyncMode::kLandAtIssue});
  all.push_back({Kernel::kHdim192, ComputeType::kBFloat16, emu::CpAsyncMode::kLandAtWait});
  all.push_back({Kernel::kHdim256, ComputeType::kFloat16, emu::CpAsyncMode::kLandAtWait});
  for (ComputeType t : {ComputeType::kFloat16, ComputeType::kBFloat16}) {
    for (auto m : {emu::CpAsyncMode::kLandAtIssue, emu::CpAsyncMode::kLandAtWait}) {
      all.push_back({Kernel::kGeneric, t, m});
    }
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Kernels, FlashEmuTest, testing::ValuesIn(AllParams()), ParamName);

}  // namespace
}  // namespace attnserve::kernels::cuda
