#include "model/module_weights.h"

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/strings.h"

namespace attnserve::model {

absl::StatusOr<kernels::MultiHeadWeights> WeightsFromSafetensors(const SafetensorsFile& file,
                                                                 int num_heads) {
  kernels::MultiHeadWeights w;
  if (num_heads > 0) {
    w.num_heads = num_heads;
  } else if (num_heads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads must be >= 0; was ", num_heads));
  } else {
    auto it = file.metadata.find("num_heads");
    if (it == file.metadata.end()) {
      return absl::InvalidArgumentError(
          "num_heads is 0 and the safetensors metadata has no 'num_heads'");
    }
    if (!absl::SimpleAtoi(it->second, &w.num_heads) || w.num_heads < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors metadata 'num_heads' must be a positive integer; was '",
                       Elide(it->second), "'"));
    }
  }

  // W_q.weight fixes d_model; every other tensor must agree with it.
  auto wq = file.Find("W_q.weight");
  if (!wq.ok()) return absl::InvalidArgumentError(wq.status().message());
  if ((*wq)->shape.size() != 2 || (*wq)->shape[0] != (*wq)->shape[1] || (*wq)->shape[0] < 1 ||
      (*wq)->shape[0] > (int64_t{1} << 16)) {
    return absl::InvalidArgumentError(
        "safetensors: 'W_q.weight' must be a square [d_model, d_model] matrix, "
        "1 <= d_model <= 65536");
  }
  w.d_model = static_cast<int>((*wq)->shape[0]);
  const int64_t d = w.d_model;
  w.w_qkv.reserve(3 * d * d);
  w.b_qkv.reserve(3 * d);

  auto append = [&](const std::string& name, std::vector<int64_t> shape,
                    std::vector<float>* dst) -> absl::Status {
    auto t = file.Find(name);
    if (!t.ok()) return absl::InvalidArgumentError(t.status().message());
    if ((*t)->shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: '", name, "' has shape ",
                       Elide(absl::StrCat("[", absl::StrJoin((*t)->shape, ", "), "]")),
                       "; expected [", absl::StrJoin(shape, ", "), "]"));
    }
    auto values = (*t)->ToFloat32(name);
    if (!values.ok()) return values.status();
    dst->insert(dst->end(), values->begin(), values->end());
    return absl::OkStatus();
  };
  for (const char* p : {"W_q", "W_k", "W_v"}) {
    if (auto s = append(absl::StrCat(p, ".weight"), {d, d}, &w.w_qkv); !s.ok()) return s;
    if (auto s = append(absl::StrCat(p, ".bias"), {d}, &w.b_qkv); !s.ok()) return s;
  }
  if (auto s = append("W_o.weight", {d, d}, &w.w_o); !s.ok()) return s;
  if (auto s = append("W_o.bias", {d}, &w.b_o); !s.ok()) return s;
  if (auto s = kernels::ValidateWeights(w); !s.ok()) return s;
  return w;
}

}  // namespace attnserve::model
