// Broadcasting a boolean mask to [B, H, Lq, Lk].
#ifndef ATTNSERVE_KERNELS_MASK_H_
#define ATTNSERVE_KERNELS_MASK_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/attention_params.h"

namespace attnserve::kernels {

// A view of the dense row-major mask `data` of `shape` (1 to 4 dimensions) broadcast to
// [b, h, lq, lk] by the usual rules: dimensions aligned to the right, each 1 (broadcast, stride
// 0) or equal to the full size. INVALID_ARGUMENT, saying which dimension fails, otherwise.
absl::StatusOr<MaskView> BroadcastMask(const uint8_t* data, absl::Span<const int64_t> shape,
                                       int64_t b, int64_t h, int64_t lq, int64_t lk);

}  // namespace attnserve::kernels

#endif  // ATTNSERVE_KERNELS_MASK_H_
