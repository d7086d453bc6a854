// A host page store (kernels/page_store.h) that a test can mark lost, as the CUDA backend's
// device stores are after it re-initialises the device; and a reference backend whose sessions'
// pages live in such stores (SessionOptions::backend).
#ifndef ATTNSERVE_TESTS_TESTING_LOSABLE_STORE_H_
#define ATTNSERVE_TESTS_TESTING_LOSABLE_STORE_H_

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/page_store.h"
#include "kernels/reference.h"

namespace attnserve::testing {

// With `device`, it passes for a device's store: on_device() and no base pointers, so that only
// WriteRows, CopyPage and ReadPage reach its pages (as the host reaches a GPU's).
class LosableStore final : public kernels::PageStore {
 public:
  explicit LosableStore(std::unique_ptr<kernels::PageStore> host, bool device = false)
      : PageStore(host->shape()), host_(std::move(host)), device_(device) {}

  void Lose() { lost_ = true; }

  bool on_device() const override { return device_; }
  void* k_base() const override { return device_ ? nullptr : host_->k_base(); }
  void* v_base() const override { return device_ ? nullptr : host_->v_base(); }
  bool lost() const override { return lost_; }
  absl::Status WriteRows(const void* k_rows, const void* v_rows,
                         absl::Span<const int64_t> rows) override {
    if (lost_) return absl::InternalError("the store is lost");
    return host_->WriteRows(k_rows, v_rows, rows);
  }
  absl::Status CopyPage(int32_t from, int32_t to) override {
    if (lost_) return absl::InternalError("the store is lost");
    return host_->CopyPage(from, to);
  }
  absl::Status ReadPage(int32_t page, void* k, void* v) const override {
    if (lost_) return absl::InternalError("the store is lost");
    return host_->ReadPage(page, k, v);
  }
  void Discard(int32_t page) override { host_->Discard(page); }

 private:
  std::unique_ptr<kernels::PageStore> host_;
  const bool device_;
  std::atomic<bool> lost_{false};
};

// The reference backend, with its session pages in LosableStores (every store it made, in
// stores(), for the test to lose); PagedAttention on a lost store fails as a device would. With
// `device`, the stores pass for a device's (its paged attention cannot read them: for what
// reaches pages through the store alone, linear sessions and snapshots).
class LosableStoreBackend final : public kernels::Backend {
 public:
  explicit LosableStoreBackend(bool device = false) : device_(device) {}
  std::string name() const override { return "reference"; }
  std::vector<kernels::DeviceInfo> devices() const override { return reference_.devices(); }
  absl::Status Attend(absl::Span<const kernels::AttentionParams> batch) override {
    return reference_.Attend(batch);
  }
  absl::Status MultiHead(absl::Span<const kernels::MultiHeadParams> batch) override {
    return reference_.MultiHead(batch);
  }
  absl::StatusOr<std::unique_ptr<kernels::PageStore>> NewPageStore(
      const kernels::PageStoreShape& shape) override {
    auto host = kernels::NewHostPageStore(shape);
    if (!host.ok()) return host.status();
    auto store = std::make_unique<LosableStore>(*std::move(host), device_);
    stores_.push_back(store.get());
    return store;
  }
  absl::Status PagedAttention(const kernels::PagedAttentionParams& p) override {
    if (p.store != nullptr && p.store->lost()) return absl::InternalError("the store is lost");
    return Backend::PagedAttention(p);
  }
  // Not thread-safe: the test makes sessions from one thread.
  const std::vector<LosableStore*>& stores() const { return stores_; }

 private:
  const bool device_;
  kernels::ReferenceBackend reference_;
  std::vector<LosableStore*> stores_;  // owned by the pool; valid while their arenas live
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_TESTING_LOSABLE_STORE_H_
