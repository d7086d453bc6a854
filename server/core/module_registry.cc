#include "server/core/module_registry.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "model/module_weights.h"
#include "model/safetensors.h"

namespace attnserve::server {

absl::Status ModuleRegistry::ValidateName(absl::string_view name, absl::string_view field) {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be 1 to 128 characters long; was ", name.size(), " characters"));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " may hold only [A-Za-z0-9_.-]; was '", name, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status ModuleRegistry::Add(std::shared_ptr<const Module> module, bool replace) {
  MutexLock lock(&mu_);
  auto it = modules_.find(module->name);
  if (it != modules_.end() && !replace) {
    return absl::AlreadyExistsError(
        absl::StrCat("module '", module->name, "' is already loaded; set replace to overwrite it"));
  }
  modules_[module->name] = std::move(module);
  return absl::OkStatus();
}

absl::Status ModuleRegistry::Remove(absl::string_view name) {
  if (auto s = ValidateName(name, "name"); !s.ok()) return s;
  MutexLock lock(&mu_);
  auto it = modules_.find(name);
  if (it == modules_.end()) {
    return absl::NotFoundError(absl::StrCat("name: no module '", name, "' is loaded"));
  }
  modules_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Module>> ModuleRegistry::Get(absl::string_view name) const {
  MutexLock lock(&mu_);
  auto it = modules_.find(name);
  if (it == modules_.end()) {
    return absl::NotFoundError(
        absl::StrCat("module: no module '", name, "' is loaded (see ListModules)"));
  }
  return it->second;
}

std::shared_ptr<const kernels::MultiHeadWeights> ModuleRegistry::Weights(
    const std::string& name) const {
  auto module = Get(name);
  if (!module.ok()) return nullptr;
  return std::shared_ptr<const kernels::MultiHeadWeights>(*module, &(*module)->weights);
}

std::vector<std::shared_ptr<const Module>> ModuleRegistry::List() const {
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const Module>> out;
  out.reserve(modules_.size());
  for (const auto& [name, module] : modules_) out.push_back(module);
  return out;
}

int64_t ModuleRegistry::TotalBytes() const {
  MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [name, module] : modules_) total += module->weights.bytes();
  return total;
}

absl::StatusOr<std::shared_ptr<const Module>> ModuleFromSafetensors(absl::string_view name,
                                                                    absl::string_view source,
                                                                    absl::string_view buffer,
                                                                    int num_heads,
                                                                    int64_t max_bytes) {
  auto file = model::ParseSafetensors(buffer);
  if (!file.ok()) return file.status();
  // Check the size before converting: W_q.weight fixes d_model.
  if (auto wq = file->Find("W_q.weight"); wq.ok() && (*wq)->shape.size() == 2) {
    const int64_t d = (*wq)->shape[0];
    const int64_t bytes = 4 * (4 * d * d + 4 * d);
    if (d > 0 && d <= (int64_t{1} << 16) && bytes > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "safetensors: a module of d_model ", d, " needs ", bytes,
          " bytes of weights; the server's limit (--max_module_bytes) is ", max_bytes));
    }
  }
  auto weights = model::WeightsFromSafetensors(*file, num_heads);
  if (!weights.ok()) return weights.status();
  auto module = std::make_shared<Module>();
  module->name = std::string(name);
  module->source = std::string(source);
  module->weights = *std::move(weights);
  return module;
}

std::shared_ptr<const Module> DemoModule() {
  constexpr int kDModel = 64;
  constexpr int kHeads = 4;
  std::mt19937 rng(20261130);
  const float bound = 1.0f / std::sqrt(static_cast<float>(kDModel));
  std::uniform_real_distribution<float> dist(-bound, bound);
  auto fill = [&](std::vector<float>* v, size_t n) {
    v->resize(n);
    for (float& x : *v) x = dist(rng);
  };
  auto module = std::make_shared<Module>();
  module->name = "demo";
  module->source = "builtin";
  kernels::MultiHeadWeights& w = module->weights;
  w.d_model = kDModel;
  w.num_heads = kHeads;
  fill(&w.w_qkv, 3 * kDModel * kDModel);
  fill(&w.b_qkv, 3 * kDModel);
  fill(&w.w_o, kDModel * kDModel);
  fill(&w.b_o, kDModel);
  return module;
}

}  // namespace attnserve::server
