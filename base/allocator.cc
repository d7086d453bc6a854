#include "base/allocator.h"

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace attnserve {
namespace {

using MallctlFn = int (*)(const char*, void*, size_t*, void*, size_t);

template <typename T>
bool Read(MallctlFn mallctl, const char* name, T* value) {
  size_t size = sizeof(T);
  return mallctl(name, value, &size, nullptr, 0) == 0 && size == sizeof(T);
}

MallctlFn Mallctl() {
  // Looked up rather than linked: the binaries without jemalloc have no mallctl.
  static const auto mallctl = reinterpret_cast<MallctlFn>(dlsym(RTLD_DEFAULT, "mallctl"));
  return mallctl;
}

}  // namespace

bool AllocatorReleaseFreeMemory() {
  const MallctlFn mallctl = Mallctl();
  // MALLCTL_ARENAS_ALL (4096): every arena.
  return mallctl != nullptr && mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0) == 0;
}

std::string AllocatorDescription() {
  const MallctlFn mallctl = Mallctl();
  const char* version = nullptr;
  if (mallctl == nullptr || !Read(mallctl, "version", &version)) {
    return "malloc of the C library or a sanitizer";
  }
  unsigned narenas = 0;
  ssize_t dirty_decay_ms = 0, muzzy_decay_ms = 0;
  bool background_thread = false;
  size_t oversize_threshold = 0;
  Read(mallctl, "opt.narenas", &narenas);
  Read(mallctl, "opt.dirty_decay_ms", &dirty_decay_ms);
  Read(mallctl, "opt.muzzy_decay_ms", &muzzy_decay_ms);
  Read(mallctl, "background_thread", &background_thread);
  Read(mallctl, "opt.oversize_threshold", &oversize_threshold);
  return absl::StrCat("jemalloc ", version, " (narenas ", narenas, ", dirty_decay_ms ",
                      dirty_decay_ms, ", muzzy_decay_ms ", muzzy_decay_ms, ", background_thread ",
                      background_thread ? "on" : "off", ", oversize_threshold ", oversize_threshold,
                      ")");
}

}  // namespace attnserve
