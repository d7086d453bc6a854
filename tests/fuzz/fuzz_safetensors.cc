// libFuzzer target: arbitrary bytes as a safetensors file. Whatever ParseSafetensors accepts must
// be readable: every tensor's bytes lie in the buffer and convert to float32 when their dtype is
// a float one.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view buffer(reinterpret_cast<const char*>(data), size);
  auto file = attnserve::model::ParseSafetensors(buffer);
  if (!file.ok()) return 0;
  for (const auto& [name, tensor] : file->tensors) {
    if (tensor.data.data() < buffer.data() ||
        tensor.data.data() + tensor.data.size() > buffer.data() + buffer.size()) {
      __builtin_trap();  // a view outside the buffer
    }
    auto values = tensor.ToFloat32(name);
    if (values.ok() && static_cast<int64_t>(values->size()) != tensor.num_elements()) {
      __builtin_trap();
    }
  }
  return 0;
}
