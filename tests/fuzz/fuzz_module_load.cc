// libFuzzer target: LoadModule's path, bytes -> ModuleFromSafetensors. The first byte is the
// request's num_heads (0: from the file's metadata), the rest the safetensors file. A module
// that loads must be usable: one self-attention call on the reference backend.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/reference.h"
#include "server/core/module_registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int num_heads = data[0] % 9;
  const absl::string_view buffer(reinterpret_cast<const char*>(data + 1), size - 1);
  auto module = attnserve::server::ModuleFromSafetensors("fuzz", "fuzz", buffer, num_heads,
                                                         /*max_bytes=*/1 << 20);
  if (!module.ok()) return 0;
  const attnserve::kernels::MultiHeadWeights& w = (*module)->weights;
  std::vector<float> x(static_cast<size_t>(2 * w.d_model), 0.5f);
  std::vector<float> out(x.size());
  attnserve::kernels::MultiHeadParams p;
  p.module = &w;
  p.batch = 1;
  p.q_len = p.kv_len = 2;
  p.query = p.key = p.value = x.data();
  p.out = out.data();
  attnserve::kernels::ReferenceBackend backend;
  if (!backend.MultiHead({p}).ok()) __builtin_trap();  // a loaded module computes
  return 0;
}
