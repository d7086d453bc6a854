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
  // Blocks until `n` calls have entered the backend (and are waiting at a closed gate or past it).
  void AwaitCalls(int n) {
    MutexLock lock(&mu_);
    while (calls_ < n) cv_.Wait(&mu_);
  }
  std::vector<int> batch_sizes() const {
    MutexLock lock(&mu_);
    return batch_sizes_;
  }

  std::string name() const override { return inner_->name(); }
  std::vector<kernels::DeviceInfo> devices() const override { return inner_->devices(); }
  absl::Status Attend(absl::Span<const kernels::AttentionParams> batch) override {
    Enter(static_cast<int>(batch.size()));
    return inner_->Attend(batch);
  }
  absl::Status MultiHead(absl::Span<const kernels::MultiHeadParams> batch) override {
    Enter(static_cast<int>(batch.size()));
    return inner_->MultiHead(batch);
  }
  // A batch of session steps: its size is the number of sequences.
  absl::Status PagedAttention(const kernels::PagedAttentionParams& p) override {
    Enter(p.num_seqs);
    return inner_->PagedAttention(p);
  }

 private:
  void Enter(int size) {
    MutexLock lock(&mu_);
    ++calls_;
    batch_sizes_.push_back(size);
    cv_.NotifyAll();
    while (!open_) cv_.Wait(&mu_);
  }

  const std::unique_ptr<kernels::Backend> inner_;
  mutable Mutex mu_;
  CondVar cv_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int> batch_sizes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_TESTING_GATED_BACKEND_H_
