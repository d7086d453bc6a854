// Named multi-head attention modules, shared by every request that uses them.
#ifndef ATTNSERVE_SERVER_CORE_MODULE_REGISTRY_H_
#define ATTNSERVE_SERVER_CORE_MODULE_REGISTRY_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "kernels/multi_head.h"

namespace attnserve::server {

// A loaded module: immutable once registered. Requests hold a shared_ptr, so a module that is
// unloaded or replaced stays alive until the last request using it finishes.
struct Module {
  std::string name;
  std::string source;  // "builtin", "file:<path>" or "rpc"
  kernels::MultiHeadWeights weights;
};

// Thread-safe: every method may be called concurrently.
class ModuleRegistry {
 public:
  // Checks a module name: 1 to 128 characters from [A-Za-z0-9_.-]. INVALID_ARGUMENT otherwise,
  // naming `field` ("name", "module", ...).
  static absl::Status ValidateName(absl::string_view name, absl::string_view field);

  // Registers `module` under module.name. ALREADY_EXISTS when the name is taken and !replace.
  absl::Status Add(std::shared_ptr<const Module> module, bool replace);
  // NOT_FOUND when absent.
  absl::Status Remove(absl::string_view name);
  // NOT_FOUND (naming the field "module" and the value) when absent.
  absl::StatusOr<std::shared_ptr<const Module>> Get(absl::string_view name) const;
  // The weights of module `name` (sharing the module's life), or null when absent: what the
  // sessions' snapshots and moves bind a module session to (SessionManager::ModuleNamed).
  std::shared_ptr<const kernels::MultiHeadWeights> Weights(const std::string& name) const;
  // Every module, sorted by name.
  std::vector<std::shared_ptr<const Module>> List() const;
  // Bytes held by the weights of every registered module.
  int64_t TotalBytes() const;

 private:
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<const Module>, std::less<>> modules_ ABSL_GUARDED_BY(mu_);
};

// Parses a safetensors buffer into a module named `name` (num_heads 0: from the metadata),
// rejecting weights over `max_bytes` with RESOURCE_EXHAUSTED.
absl::StatusOr<std::shared_ptr<const Module>> ModuleFromSafetensors(absl::string_view name,
                                                                    absl::string_view source,
                                                                    absl::string_view buffer,
                                                                    int num_heads,
                                                                    int64_t max_bytes);

// The built-in "demo" module the server starts with: d_model 64, 4 heads, weights drawn from a
// fixed-seed generator (nn.Linear's default uniform(-1/sqrt(in), 1/sqrt(in))), so every server
// answers a first request identically.
std::shared_ptr<const Module> DemoModule();

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CORE_MODULE_REGISTRY_H_
