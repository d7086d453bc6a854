// The CUDA backend as a plugin the server loads with dlopen (kernels/backend_factory.cc).
//
// Why a plugin: linked into the server, cuBLAS's large static TLS block would be carved out of
// every thread's stack, and libraries that start threads with small stacks (civetweb, under the
// metrics endpoint) fail to start them. Loaded with dlopen, cuBLAS's TLS is dynamic, and a
// server on a machine without CUDA libraries starts without them.
#include <cstddef>
#include <cstring>
#include <memory>

#include "kernels/cuda/cuda_backend.h"

namespace {

void CopyMessage(absl::string_view message, char* out, size_t out_size) {
  if (out == nullptr || out_size == 0) return;
  const size_t n = std::min(out_size - 1, message.size());
  std::memcpy(out, message.data(), n);
  out[n] = '\0';
}

}  // namespace

// Creates a CudaBackend with default options. Returns the absl::StatusCode of the outcome (0 =
// OK, *backend set and owned by the caller) and writes a failure's message into `message`.
extern "C" __attribute__((visibility("default"))) int attnserve_cuda_create_backend(
    attnserve::kernels::Backend** backend, char* message, size_t message_size) {
  auto created =
      attnserve::kernels::cuda::CreateCudaBackend(attnserve::kernels::cuda::CudaBackendOptions());
  if (!created.ok()) {
    CopyMessage(created.status().message(), message, message_size);
    return static_cast<int>(created.status().code());
  }
  *backend = created->release();
  return 0;
}
