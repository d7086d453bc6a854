#include "model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/float16.h"
#include "base/strings.h"
#include "nlohmann/json.hpp"

namespace attnserve::model {
namespace {

// Largest header we accept (the format's own limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
// The deepest JSON the format needs: the header object (1), a tensor's object or __metadata__
// (2), a shape or data_offsets array (3).
constexpr int kMaxJsonDepth = 3;

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
  const bool f32 = dtype == "F32", f16 = dtype == "F16", bf16 = dtype == "BF16";
  if (!f32 && !f16 && !bf16) {
    return Bad(absl::StrCat("tensor '", Elide(name), "' has dtype ", Elide(dtype),
                            "; expected F32, F16 or BF16"));
  }
  std::vector<float> out(static_cast<size_t>(num_elements()));
  // An empty tensor's data may be null, which memcpy must not see (found by fuzz_safetensors).
  if (out.empty()) return out;
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  if (f32) {
    std::memcpy(out.data(), bytes, out.size() * sizeof(float));  // little-endian, like the host
    return out;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const auto h = static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
    out[i] = f16 ? HalfToFloat(h) : BFloat16ToFloat(h);
  }
  return out;
}

absl::StatusOr<const SafetensorsTensor*> SafetensorsFile::Find(absl::string_view name) const {
  auto it = tensors.find(std::string(name));
  if (it == tensors.end()) {
    return absl::NotFoundError(absl::StrCat("safetensors: no tensor named '", Elide(name), "'"));
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

  // nlohmann keeps the last of two equal keys; the format has one entry per name, so a repeated
  // key (at any level) is an error, as is nesting deeper than the format's.
  std::vector<std::set<std::string>> keys;  // the keys seen in each open object
  std::string json_error;
  auto check = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (!json_error.empty()) return true;
    if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxJsonDepth) {
      json_error =
          absl::StrCat("header nests JSON deeper than the format's ", kMaxJsonDepth, " levels");
      return false;  // not kept: a deep header costs no memory
    } else if (event == Event::object_start) {
      keys.emplace_back();
    } else if (event == Event::object_end && !keys.empty()) {
      keys.pop_back();
    } else if (event == Event::key && !keys.empty() &&
               !keys.back().insert(parsed.get<std::string>()).second) {
      json_error = absl::StrCat("header has the key '", Elide(parsed.get<std::string>()),
                                "' twice in one object");
    }
    return true;
  };
  nlohmann::json json = nlohmann::json::parse(header.begin(), header.end(), check,
                                              /*allow_exceptions=*/false);
  if (json.is_discarded()) return Bad("header is not valid JSON");
  if (!json_error.empty()) return Bad(json_error);
  if (!json.is_object()) return Bad("header is not a JSON object");

  SafetensorsFile file;
  struct Extent {
    uint64_t begin, end;
    const std::string* name;  // a key of file.tensors (a std::map: stable)
  };
  std::vector<Extent> extents;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Bad("__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return Bad(absl::StrCat("__metadata__['", Elide(key), "'] is not a string"));
        }
        file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) return Bad(absl::StrCat("entry '", Elide(name), "' is not an object"));
    auto dtype = entry.find("dtype");
    auto shape = entry.find("shape");
    auto offsets = entry.find("data_offsets");
    if (dtype == entry.end() || !dtype->is_string()) {
      return Bad(absl::StrCat("tensor '", Elide(name), "' has no string 'dtype'"));
    }
    if (shape == entry.end() || !shape->is_array()) {
      return Bad(absl::StrCat("tensor '", Elide(name), "' has no array 'shape'"));
    }
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2) {
      return Bad(absl::StrCat("tensor '", Elide(name), "' has no two-element 'data_offsets'"));
    }
    SafetensorsTensor t;
    t.dtype = dtype->get<std::string>();
    const int64_t elem_bytes = DTypeBytes(t.dtype);
    if (elem_bytes == 0)
      return Bad(absl::StrCat("tensor '", Elide(name), "' has unknown dtype ", Elide(t.dtype)));

    // Element count with overflow checks: every dim is a non-negative integer and the product
    // stays far below what the buffer could hold.
    int64_t elements = 1;
    for (const auto& dim : *shape) {
      if (!dim.is_number_unsigned()) {
        return Bad(absl::StrCat("tensor '", name,
                                "' has a shape entry that is not a "
                                "non-negative integer: ",
                                Elide(dim.dump())));
      }
      const uint64_t d = dim.get<uint64_t>();
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (elements != 0 &&
           static_cast<int64_t>(d) > std::numeric_limits<int64_t>::max() / elem_bytes / elements)) {
        return Bad(absl::StrCat("tensor '", Elide(name), "' shape overflows"));
      }
      t.shape.push_back(static_cast<int64_t>(d));
      elements *= static_cast<int64_t>(d);
    }
    const auto& begin_json = (*offsets)[0];
    const auto& end_json = (*offsets)[1];
    if (!begin_json.is_number_unsigned() || !end_json.is_number_unsigned()) {
      return Bad(
          absl::StrCat("tensor '", Elide(name), "' data_offsets are not non-negative integers"));
    }
    const uint64_t begin = begin_json.get<uint64_t>();
    const uint64_t end = end_json.get<uint64_t>();
    if (begin > end || end > data.size()) {
      return Bad(absl::StrCat("tensor '", Elide(name), "' data_offsets [", begin, ", ", end,
                              ") lie outside the data buffer of ", data.size(), " bytes"));
    }
    if (end - begin != static_cast<uint64_t>(elements * elem_bytes)) {
      return Bad(absl::StrCat("tensor '", Elide(name), "' holds ", end - begin,
                              " bytes; its dtype ", t.dtype, " and shape need ",
                              elements * elem_bytes));
    }
    t.data = data.substr(begin, end - begin);
    auto it = file.tensors.emplace(name, std::move(t)).first;
    extents.push_back({begin, end, &it->first});
  }

  // The format's layout rule: the tensors' byte ranges, in offset order, tile the data buffer
  // exactly: no overlap, no hole, nothing after the last one.
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;  // bytes [0, covered) belong to the tensors checked so far
  const std::string* previous = nullptr;
  for (const Extent& e : extents) {
    if (e.begin < covered) {
      return Bad(absl::StrCat("tensor '", Elide(*e.name), "' data_offsets [", e.begin, ", ", e.end,
                              ") overlap those of tensor '", Elide(*previous), "' (which end at ",
                              covered, ")"));
    }
    if (e.begin > covered) {
      return Bad(absl::StrCat("tensor '", Elide(*e.name), "' data_offsets [", e.begin, ", ", e.end,
                              ") leave bytes [", covered, ", ", e.begin,
                              ") of the data buffer to no tensor"));
    }
    covered = e.end;
    previous = e.name;
  }
  if (covered != data.size()) {
    return Bad(absl::StrCat("the data buffer has ", data.size() - covered,
                            " bytes after the last tensor's (", data.size(), " bytes, tensors ",
                            "cover [0, ", covered, "))"));
  }
  return file;
}

}  // namespace attnserve::model
