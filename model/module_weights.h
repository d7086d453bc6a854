// Multi-head module weights from a file: the reference module's state_dict() in safetensors,
// turned into the kernels' MultiHeadWeights (kernels/multi_head.h). The one place a module's
// tensor names, shapes and dtypes are read.
//
// Thread-safety: pure functions.
#ifndef ATTNSERVE_MODEL_MODULE_WEIGHTS_H_
#define ATTNSERVE_MODEL_MODULE_WEIGHTS_H_

#include "absl/status/statusor.h"
#include "kernels/multi_head.h"
#include "model/safetensors.h"

namespace attnserve::model {

// Builds module weights from a safetensors file holding the reference module's state_dict()
// names: W_q.weight, W_q.bias, W_k.weight, W_k.bias, W_v.weight, W_v.bias, W_o.weight, W_o.bias
// (weights [d_model, d_model], biases [d_model]; F32, F16 or BF16). `num_heads` > 0 is used as
// given; 0 takes it from the metadata key "num_heads". Other tensors in the file are ignored.
// Errors are INVALID_ARGUMENT naming the tensor or key.
absl::StatusOr<kernels::MultiHeadWeights> WeightsFromSafetensors(const SafetensorsFile& file,
                                                                 int num_heads);

}  // namespace attnserve::model

#endif  // ATTNSERVE_MODEL_MODULE_WEIGHTS_H_
