#include "kernels/safetensors.h"

#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "kernels/dtype.h"
#include "nlohmann/json.hpp"

namespace attnserve::kernels {
namespace {

// Largest header we accept (the format's own limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

int64_t DTypeBytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "BOOL" || dtype == "U8" || dtype == "I8" || dtype == "F8_E4M3" ||
      dtype == "F8_E5M2") {
    return 1;
  }
  return 0;
}

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: ", what));
}

}  // namespace

int64_t SafetensorsTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::vector<float>> SafetensorsTensor::ToFloat32(absl::string_view name) const {
  DType type;
  if (dtype == "F32") {
    type = DType::kFloat32;
  } else if (dtype == "F16") {
    type = DType::kFloat16;
  } else if (dtype == "BF16") {
    type = DType::kBFloat16;
  } else {
    return Bad(
        absl::StrCat("tensor '", name, "' has dtype ", dtype, "; expected F32, F16 or BF16"));
  }
  std::vector<float> out(static_cast<size_t>(num_elements()));
  kernels::ToFloat32(type, data.data(), out.size(), out.data());
  return out;
}

absl::StatusOr<const SafetensorsTensor*> SafetensorsFile::Find(absl::string_view name) const {
  auto it = tensors.find(std::string(name));
  if (it == tensors.end()) {
    return absl::NotFoundError(absl::StrCat("safetensors: no tensor named '", name, "'"));
  }
  return &it->second;
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view buffer) {
  if (buffer.size() < 8) {
    return Bad(absl::StrCat("file is ", buffer.size(), " bytes; at least 8 needed"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(buffer[i]);
  if (header_len > kMaxHeaderBytes || header_len > buffer.size() - 8) {
    return Bad(absl::StrCat("header length ", header_len, " exceeds the file (", buffer.size() - 8,
                            " bytes after the length)"));
  }
  const absl::string_view header = buffer.substr(8, header_len);
  const absl::string_view data = buffer.substr(8 + header_len);

  nlohmann::json json = nlohmann::json::parse(header.begin(), header.end(), /*cb=*/nullptr,
                                              /*allow_exceptions=*/false);
  if (json.is_discarded()) return Bad("header is not valid JSON");
  if (!json.is_object()) return Bad("header is not a JSON object");

  SafetensorsFile file;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Bad("__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return Bad(absl::StrCat("__metadata__['", key, "'] is not a string"));
        }
        file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) return Bad(absl::StrCat("entry '", name, "' is not an object"));
    auto dtype = entry.find("dtype");
    auto shape = entry.find("shape");
    auto offsets = entry.find("data_offsets");
    if (dtype == entry.end() || !dtype->is_string()) {
      return Bad(absl::StrCat("tensor '", name, "' has no string 'dtype'"));
    }
    if (shape == entry.end() || !shape->is_array()) {
      return Bad(absl::StrCat("tensor '", name, "' has no array 'shape'"));
    }
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2) {
      return Bad(absl::StrCat("tensor '", name, "' has no two-element 'data_offsets'"));
    }
    SafetensorsTensor t;
    t.dtype = dtype->get<std::string>();
    const int64_t elem_bytes = DTypeBytes(t.dtype);
    if (elem_bytes == 0)
      return Bad(absl::StrCat("tensor '", name, "' has unknown dtype ", t.dtype));

    // Element count with overflow checks: every dim is a non-negative integer and the product
    // stays far below what the buffer could hold.
    int64_t elements = 1;
    for (const auto& dim : *shape) {
      if (!dim.is_number_unsigned()) {
        return Bad(absl::StrCat("tensor '", name,
                                "' has a shape entry that is not a "
                                "non-negative integer: ",
                                dim.dump()));
      }
      const uint64_t d = dim.get<uint64_t>();
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (elements != 0 &&
           static_cast<int64_t>(d) > std::numeric_limits<int64_t>::max() / elem_bytes / elements)) {
        return Bad(absl::StrCat("tensor '", name, "' shape overflows"));
      }
      t.shape.push_back(static_cast<int64_t>(d));
      elements *= static_cast<int64_t>(d);
    }
    const auto& begin_json = (*offsets)[0];
    const auto& end_json = (*offsets)[1];
    if (!begin_json.is_number_unsigned() || !end_json.is_number_unsigned()) {
      return Bad(absl::StrCat("tensor '", name, "' data_offsets are not non-negative integers"));
    }
    const uint64_t begin = begin_json.get<uint64_t>();
    const uint64_t end = end_json.get<uint64_t>();
    if (begin > end || end > data.size()) {
      return Bad(absl::StrCat("tensor '", name, "' data_offsets [", begin, ", ", end,
                              ") lie outside the data buffer of ", data.size(), " bytes"));
    }
    if (end - begin != static_cast<uint64_t>(elements * elem_bytes)) {
      return Bad(absl::StrCat("tensor '", name, "' holds ", end - begin, " bytes; its dtype ",
                              t.dtype, " and shape need ", elements * elem_bytes));
    }
    t.data = data.substr(begin, end - begin);
    file.tensors.emplace(name, std::move(t));
  }
  return file;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in.good() && !in.eof()) return absl::DataLossError(absl::StrCat("cannot read '", path, "'"));
  return std::move(ss).str();
}

}  // namespace attnserve::kernels
