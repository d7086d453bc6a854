#include "kernels/mask.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/strings.h"

namespace attnserve::kernels {

absl::StatusOr<MaskView> BroadcastMask(const uint8_t* data, absl::Span<const int64_t> shape,
                                       int64_t b, int64_t h, int64_t lq, int64_t lk) {
  const int rank = static_cast<int>(shape.size());
  if (rank < 1 || rank > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask must have 1 to 4 dimensions; was ",
                     Elide(absl::StrCat("[", absl::StrJoin(shape, ", "), "]"))));
  }
  const int64_t full[4] = {b, h, lq, lk};
  const char* names[4] = {"B", "H", "Lq", "Lk"};
  int64_t strides[4] = {0, 0, 0, 0};
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    const int target = 4 - rank + i;
    const int64_t d = shape[i];
    if (d != 1 && d != full[target]) {
      return absl::InvalidArgumentError(
          absl::StrCat("mask shape [", absl::StrJoin(shape, ", "),  // rank <= 4 here
                       "] is not broadcastable to [B, H, Lq, Lk] = [", b, ", ", h, ", ", lq, ", ",
                       lk, "]: dimension ", i, " is ", d, "; must be 1 or ", names[target], " (",
                       full[target], ")"));
    }
    strides[target] = d == 1 ? 0 : stride;
    stride *= d;
  }
  MaskView view;
  view.data = data;
  view.batch_stride = strides[0];
  view.head_stride = strides[1];
  view.row_stride = strides[2];
  view.col_stride = strides[3];
  return view;
}

}  // namespace attnserve::kernels
