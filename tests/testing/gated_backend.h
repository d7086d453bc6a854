// A backend for serving tests: computes with an inner backend (the reference path by default),
// but each call first waits at a gate the test opens, and records the batch sizes it was called
// with. With the gate closed a
// test can fill queues, let deadlines pass or cancel calls deterministically.
#ifndef ATTNSERVE_TESTS_TESTING_GATED_BACKEND_H_
#define ATTNSERVE_TESTS_TESTING_GATED_BACKEND_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"
#include "kernels/reference.h"

namespace attnserve::testing {

// Thread-safe.
class GatedBackend final : public kernels::Backend {
 public:
  explicit GatedBackend(
      std::unique_ptr<kernels::Backend> inner = std::make_unique<kernels::ReferenceBackend>())
      : inner_(std::move(inner)) {}

  void Open() {
    MutexLock lock(&mu_);
    open_ = true;
    cv_.NotifyAll();
  }
  void Close() {
    MutexLock lock(&mu_);
    open_ = false;
  }
  // Blocks until `n` calls have entered the backend (and are waiting at a closed gate or past it),
  // counting from the backend's creation: ServerHost::Start's warm-up Attend is one of them, so
  // wait for batch_sizes().size() + k, taken before the calls are made.
  void AwaitCalls(int n) {
    MutexLock lock(&mu_);
    while (calls_ < n) cv_.Wait(&mu_);
  }
  // Per call, in arrival order: its batch size (PagedAttention: the number of sequences) and its
  // query rows (batch x Lq summed over the batch; PagedAttention: total_q).
  std::vector<int> batch_sizes() const {
    MutexLock lock(&mu_);
    return batch_sizes_;
  }
  std::vector<int> rows() const {
    MutexLock lock(&mu_);
    return rows_;
  }

  std::string name() const override { return inner_->name(); }
  std::vector<kernels::DeviceInfo> devices() const override { return inner_->devices(); }
  bool supports_linear_attention() const override { return inner_->supports_linear_attention(); }
  bool supports_session_score_mods() const override {
    return inner_->supports_session_score_mods();
  }
  absl::Status Attend(absl::Span<const kernels::AttentionParams> batch) override {
    int rows = 0;
    for (const kernels::AttentionParams& p : batch) rows += p.batch * p.q_len;
    Enter(static_cast<int>(batch.size()), rows);
    return inner_->Attend(batch);
  }
  absl::Status MultiHead(absl::Span<const kernels::MultiHeadParams> batch) override {
    int rows = 0;
    for (const kernels::MultiHeadParams& p : batch) rows += p.batch * p.q_len;
    Enter(static_cast<int>(batch.size()), rows);
    return inner_->MultiHead(batch);
  }
  // Module sessions' projections: not gated (their extends are gated at PagedAttention).
  absl::Status Project(absl::Span<const kernels::ProjectionParams> batch) override {
    return inner_->Project(batch);
  }
  // A batch of session steps: its size is the number of sequences.
  absl::Status PagedAttention(const kernels::PagedAttentionParams& p) override {
    Enter(p.num_seqs, p.total_q);
    return inner_->PagedAttention(p);
  }
  absl::StatusOr<std::unique_ptr<kernels::PageStore>> NewPageStore(
      const kernels::PageStoreShape& shape) override {
    return inner_->NewPageStore(shape);
  }

 private:
  void Enter(int size, int rows) {
    MutexLock lock(&mu_);
    ++calls_;
    batch_sizes_.push_back(size);
    rows_.push_back(rows);
    cv_.NotifyAll();
    while (!open_) cv_.Wait(&mu_);
  }

  const std::unique_ptr<kernels::Backend> inner_;
  mutable Mutex mu_;
  CondVar cv_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int> batch_sizes_ ABSL_GUARDED_BY(mu_);
  std::vector<int> rows_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_TESTING_GATED_BACKEND_H_
