// libFuzzer target: mask broadcasting. The input gives [B, H, Lq, Lk] (1 to 8 each), a rank
// (1 to 4 or out of range) and the mask's dims (0 to 9, so that both matching and mismatching
// shapes occur); the rest is the mask's data. Whenever BroadcastMask accepts, every one of the
// B*H*Lq*Lk elements of the view must lie inside the data (AddressSanitizer checks the reads).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/mask.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 9) return 0;
  const int64_t b = 1 + data[0] % 8, h = 1 + data[1] % 8, lq = 1 + data[2] % 8,
                lk = 1 + data[3] % 8;
  const int rank = data[4] % 6;  // 0 and 5 are invalid
  std::vector<int64_t> shape;
  int64_t elements = 1;
  for (int i = 0; i < rank && i < 4; ++i) {
    shape.push_back(data[5 + i] % 10);
    elements *= shape.back();
  }
  if (rank == 5) shape.push_back(1);
  // The mask's bytes in a buffer of exactly its size, as the request builder guarantees.
  auto mask = std::make_unique<uint8_t[]>(static_cast<size_t>(elements > 0 ? elements : 1));
  for (int64_t i = 0; i < elements; ++i) mask[i] = data[(9 + i) % size] & 1;
  auto view = attnserve::kernels::BroadcastMask(mask.get(), shape, b, h, lq, lk);
  if (!view.ok()) return 0;
  if (elements == 0) __builtin_trap();  // an empty mask cannot cover [B, H, Lq, Lk]
  unsigned sum = 0;
  for (int64_t ib = 0; ib < b; ++ib) {
    for (int64_t ih = 0; ih < h; ++ih) {
      for (int64_t i = 0; i < lq; ++i) {
        for (int64_t j = 0; j < lk; ++j) sum += view->at(ib, ih, i, j);
      }
    }
  }
  volatile unsigned sink = sum;  // the reads are what is checked
  (void)sink;
  return 0;
}
