#include "kernels/page_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnserve::kernels {
namespace {

// Transparent huge pages: the decode kernel reads a sequence's pages scattered through the
// store, one run of a few KiB per page, so with 4 KiB memory pages nearly every run is a TLB
// miss (a two-level walk in a VM). 2 MiB pages cover the store with a few hundred TLB entries;
// tests/bench/DECODE.md has the kernel with and without them.
constexpr int64_t kHugePage = int64_t{2} << 20;

// The system's page size: munmap and madvise work in whole pages of it.
int64_t SystemPageBytes() {
  static const int64_t bytes = sysconf(_SC_PAGESIZE);
  return bytes;
}

// The range starts on a 2 MiB boundary (so that every whole 2 MiB of it can be a huge page) and
// is advised MADV_HUGEPAGE; the kernel gives small pages where it has no huge ones, and where
// transparent huge pages are off.
uint8_t* Reserve(int64_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t padded = static_cast<size_t>(bytes + kHugePage);
  void* raw = mmap(nullptr, padded, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  uint8_t* const begin = static_cast<uint8_t*>(raw);
  const uintptr_t at = reinterpret_cast<uintptr_t>(begin);
  uint8_t* const p = begin + ((kHugePage - at % kHugePage) % kHugePage);
  // The tail is cut at a system page boundary (munmap takes whole pages; the destructor unmaps
  // `bytes` from p, which the system rounds up the same way).
  const int64_t system_page = SystemPageBytes();
  uint8_t* const keep_end = p + (bytes + system_page - 1) / system_page * system_page;
  uint8_t* const end = begin + padded;
  if (p > begin) munmap(begin, static_cast<size_t>(p - begin));
  if (end > keep_end) munmap(keep_end, static_cast<size_t>(end - keep_end));
  madvise(p, static_cast<size_t>(bytes), MADV_HUGEPAGE);
  return p;
}

}  // namespace

absl::Status PageStore::WritePage(int32_t page, const void* k, const void* v) {
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(shape_.num_kv_heads) * shape_.page_size);
  for (int h = 0; h < shape_.num_kv_heads; ++h) {
    for (int slot = 0; slot < shape_.page_size; ++slot) rows.push_back(shape_.row(page, h, slot));
  }
  return WriteRows(k, v, rows);
}

namespace {

class HostPageStore final : public PageStore {
 public:
  explicit HostPageStore(const PageStoreShape& shape) : PageStore(shape) {}
  ~HostPageStore() override {
    if (k_ != nullptr) munmap(k_, static_cast<size_t>(k_bytes()));
    if (v_ != nullptr) munmap(v_, static_cast<size_t>(v_bytes()));
  }

  absl::Status Init() {
    k_ = Reserve(k_bytes());
    v_ = Reserve(v_bytes());
    if ((k_bytes() > 0 && k_ == nullptr) || (v_bytes() > 0 && v_ == nullptr)) {
      return absl::InternalError(absl::StrCat("cannot reserve ", k_bytes() + v_bytes(),
                                              " bytes of address space for the session pool"));
    }
    return absl::OkStatus();
  }

  bool on_device() const override { return false; }
  void* k_base() const override { return k_; }
  void* v_base() const override { return v_; }

  absl::Status WriteRows(const void* k_rows, const void* v_rows,
                         absl::Span<const int64_t> rows) override {
    const size_t esize = DTypeSize(shape().dtype);
    const size_t k_row = static_cast<size_t>(shape().head_dim) * esize;
    const size_t v_row = static_cast<size_t>(shape().v_head_dim) * esize;
    const auto* k = static_cast<const uint8_t*>(k_rows);
    const auto* v = static_cast<const uint8_t*>(v_rows);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(k_ + rows[i] * k_row, k + i * k_row, k_row);
      std::memcpy(v_ + rows[i] * v_row, v + i * v_row, v_row);
    }
    return absl::OkStatus();
  }

  absl::Status CopyPage(int32_t from, int32_t to) override {
    const int64_t kb = shape().k_page_bytes(), vb = shape().v_page_bytes();
    std::memcpy(k_ + to * kb, k_ + from * kb, static_cast<size_t>(kb));
    std::memcpy(v_ + to * vb, v_ + from * vb, static_cast<size_t>(vb));
    return absl::OkStatus();
  }

  absl::Status ReadPage(int32_t page, void* k, void* v) const override {
    const int64_t kb = shape().k_page_bytes(), vb = shape().v_page_bytes();
    std::memcpy(k, k_ + page * kb, static_cast<size_t>(kb));
    std::memcpy(v, v_ + page * vb, static_cast<size_t>(vb));
    return absl::OkStatus();
  }

  absl::Status WritePage(int32_t page, const void* k, const void* v) override {
    const int64_t kb = shape().k_page_bytes(), vb = shape().v_page_bytes();
    std::memcpy(k_ + page * kb, k, static_cast<size_t>(kb));
    std::memcpy(v_ + page * vb, v, static_cast<size_t>(vb));
    return absl::OkStatus();
  }

  // Hands a freed page's memory back to the system when it covers whole system pages. Inside a
  // huge page this splits it (the rest stays resident in small pages until the kernel's
  // khugepaged merges them again): resident memory follows the accounting first.
  void Discard(int32_t page) override {
    const int64_t kb = shape().k_page_bytes(), vb = shape().v_page_bytes();
    const int64_t system_page = SystemPageBytes();
    if (kb > 0 && kb % system_page == 0)
      madvise(k_ + page * kb, static_cast<size_t>(kb), MADV_DONTNEED);
    if (vb > 0 && vb % system_page == 0)
      madvise(v_ + page * vb, static_cast<size_t>(vb), MADV_DONTNEED);
  }

 private:
  int64_t k_bytes() const { return int64_t{shape().capacity} * shape().k_page_bytes(); }
  int64_t v_bytes() const { return int64_t{shape().capacity} * shape().v_page_bytes(); }

  uint8_t* k_ = nullptr;
  uint8_t* v_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PageStore>> NewHostPageStore(const PageStoreShape& shape) {
  auto store = std::make_unique<HostPageStore>(shape);
  if (absl::Status s = store->Init(); !s.ok()) return s;
  return store;
}

}  // namespace attnserve::kernels
