// The bytes of a safetensors file: an 8-byte little-endian header length, the JSON header, and
// the data (the tests of model/ build their files with it).
#ifndef ATTNSERVE_TESTS_MODEL_SAFETENSORS_BYTES_H_
#define ATTNSERVE_TESTS_MODEL_SAFETENSORS_BYTES_H_

#include <cstdint>
#include <string>

namespace attnserve::model {

inline std::string File(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

}  // namespace attnserve::model

#endif  // ATTNSERVE_TESTS_MODEL_SAFETENSORS_BYTES_H_
