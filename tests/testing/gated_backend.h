// A backend for serving tests: computes with an inner backend (the reference path by default),
// but each call first waits at a gate the test opens, and records the batch sizes it was called
// with. With the gate closed a
// test can fill queues, let deadlines pass or cancel calls deterministically.
#ifndef ATTNSERVE_TESTS_TESTING_GATED_BACKEND_H_
#define ATTNSERVE_TESTS_TESTING_GATED_BACKEND_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/reference.h"

namespace attnserve::testing {

// Thread-safe.
class GatedBackend final : public kernels::Backend {
 public:
  explicit GatedBackend(
      std::unique_ptr<kernels::Backend> inner = std::make_unique<kernels::ReferenceBackend>())
      : inner_(std::move(inner)) {}

  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }
  // Blocks until `n` calls have entered the backend (and are waiting at a closed gate or past it).
  void AwaitCalls(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return calls_ >= n; });
  }
  std::vector<int> batch_sizes() const {
    std::lock_guard<std::mutex> lock(mu_);
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

 private:
  void Enter(int size) {
    std::unique_lock<std::mutex> lock(mu_);
    ++calls_;
    batch_sizes_.push_back(size);
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }

  const std::unique_ptr<kernels::Backend> inner_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int calls_ = 0;
  std::vector<int> batch_sizes_;
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_TESTING_GATED_BACKEND_H_
