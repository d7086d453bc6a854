// A reader for the safetensors format (https://github.com/huggingface/safetensors):
//   8 bytes: N, the header length, unsigned little-endian
//   N bytes: a JSON object {name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]},
//            ..., "__metadata__": {string: string}}
//   the rest: the data buffer; offsets are relative to its start.
//
// Every offset, size and shape is checked against the buffer before anything is read: a
// malformed file yields INVALID_ARGUMENT naming the tensor and the problem, never a crash.
// Strict where the format is: the tensors' data_offsets, taken in order, must tile the data
// buffer exactly (no overlap, no hole, no trailing bytes); no JSON object may repeat a key; the
// header is at most 100 MB and nests at most 3 levels (header, entry, shape/offsets array).
// Names and values quoted in errors are elided past 96 bytes (base/strings.h).
//
// Depends on base/ alone (no kernels): attnserve-cli links it to read seed-vector files.
// Thread-safety: ParseSafetensors is a pure function; a parsed file is immutable.
#ifndef ATTNSERVE_MODEL_SAFETENSORS_H_
#define ATTNSERVE_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnserve::model {

struct SafetensorsTensor {
  std::string dtype;           // as in the file: "F32", "F16", "BF16", "BOOL", "I64", ...
  std::vector<int64_t> shape;  // empty for a scalar
  absl::string_view data;      // the tensor's bytes, a view into the parsed buffer

  int64_t num_elements() const;
  // The data as float32 (F32, F16 and BF16 are converted); INVALID_ARGUMENT for other dtypes.
  absl::StatusOr<std::vector<float>> ToFloat32(absl::string_view name) const;
};

struct SafetensorsFile {
  std::map<std::string, SafetensorsTensor> tensors;  // views into the buffer given to Parse
  std::map<std::string, std::string> metadata;       // "__metadata__", string values only

  // The tensor named `name`, or NOT_FOUND.
  absl::StatusOr<const SafetensorsTensor*> Find(absl::string_view name) const;
};

// Parses `buffer`. The result holds views into `buffer`, which must outlive it.
absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view buffer);

}  // namespace attnserve::model

#endif  // ATTNSERVE_MODEL_SAFETENSORS_H_
