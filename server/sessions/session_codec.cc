#include "server/sessions/session_codec.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace attnserve::server::sessions {

namespace {

// The reflected Castagnoli polynomial.
constexpr uint32_t kCastagnoli = 0x82F63B78u;

struct Crc32cTable {
  uint32_t entry[256];
  constexpr Crc32cTable() : entry() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kCastagnoli & (0u - (c & 1u)));
      entry[i] = c;
    }
  }
};
constexpr Crc32cTable kTable;

uint32_t Crc32cTableDriven(uint32_t c, const uint8_t* p, size_t n) {
  for (; n > 0; --n, ++p) c = kTable.entry[(c ^ *p) & 0xFFu] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t c, const uint8_t* p, size_t n) {
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, sizeof v);
    c64 = _mm_crc32_u64(c64, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c64);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}
#endif

}  // namespace

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n) {
  return ~Crc32cTableDriven(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  static const bool sse42 = __builtin_cpu_supports("sse4.2");
  if (sse42) return ~Crc32cSse42(~crc, p, n);
#endif
  return Crc32cPortable(crc, p, n);
}

uint32_t ModuleChecksum(const kernels::MultiHeadWeights& w) {
  uint32_t crc = Crc32c(0, &w.d_model, sizeof w.d_model);
  crc = Crc32c(crc, &w.num_heads, sizeof w.num_heads);
  for (const std::vector<float>* v : {&w.w_qkv, &w.b_qkv, &w.w_o, &w.b_o}) {
    crc = Crc32c(crc, v->data(), v->size() * sizeof(float));
  }
  return crc;
}

void TransferWriter::Put(const void* data, size_t n) {
  if (!ok_) return;
  crc_ = Crc32c(crc_, data, n);
  bytes_ += n;
  if (f_ != nullptr) {
    ok_ = std::fwrite(data, 1, n, f_) == n;
  } else {
    out_->append(static_cast<const char*>(data), n);
  }
}

char* TransferWriter::Reserve(size_t n) {
  reserved_ = n;
  if (f_ != nullptr) {
    scratch_.resize(n);
    return scratch_.data();
  }
  const size_t at = out_->size();
  out_->resize(at + n);
  return out_->data() + at;
}

void TransferWriter::Commit() {
  const size_t n = reserved_;
  reserved_ = 0;
  if (f_ != nullptr) {
    Put(scratch_.data(), n);
    return;
  }
  // The bytes are in place: count and checksum them.
  crc_ = Crc32c(crc_, out_->data() + out_->size() - n, n);
  bytes_ += n;
}

void TransferWriter::Trailer() {
  const uint64_t length = bytes_;
  const uint32_t crc = crc_;
  Put(kTransferEnd, sizeof kTransferEnd);
  Num(length);
  Num(crc);
}

bool TransferReader::Get(void* data, size_t n) {
  if (!ok_) return false;
  if (f_ != nullptr) {
    ok_ = std::fread(data, 1, n, f_) == n;
  } else if (bytes_.size() - position_ < n) {
    ok_ = false;
  } else {
    std::memcpy(data, bytes_.data() + position_, n);
  }
  if (ok_) position_ += n;
  return ok_;
}

std::string TransferReader::Str() {
  const uint32_t n = Num<uint32_t>();
  if (!ok_ || n > (1u << 20)) {
    ok_ = false;
    return "";
  }
  std::string s(n, '\0');
  Get(s.data(), n);
  return s;
}

namespace {

// A transfer of another version is refused for that, before its checksum (of another kind).
absl::Status CheckVersion(const char* head, const std::string& what) {
  uint32_t version = 0;
  std::memcpy(&version, head + sizeof kTransferMagic, sizeof version);
  if (std::memcmp(head, kTransferMagic, sizeof kTransferMagic) != 0 ||
      version == kTransferVersion) {
    return absl::OkStatus();  // the checksum, then the parse, say what is wrong
  }
  return absl::FailedPreconditionError(
      absl::StrCat(what, " is of version ", version, "; this server reads version ",
                   kTransferVersion, " (a snapshot written by another release of attnserve)"));
}

absl::Status TooShort(const std::string& what, uint64_t size) {
  return absl::DataLossError(
      absl::StrCat(what, " is torn: ", size, " bytes, shorter than its header and trailer"));
}

}  // namespace

absl::Status CheckTransferTrailer(const char* trailer, uint64_t size, uint32_t actual,
                                  const std::string& what) {
  uint64_t length = 0;
  uint32_t crc = 0;
  std::memcpy(&length, trailer + sizeof kTransferEnd, sizeof length);
  std::memcpy(&crc, trailer + sizeof kTransferEnd + sizeof length, sizeof crc);
  if (std::memcmp(trailer, kTransferEnd, sizeof kTransferEnd) != 0 ||
      length != size - kTransferTrailer) {
    return absl::DataLossError(absl::StrCat(
        what, " is torn: its trailer is missing or names another length (", size, " bytes)"));
  }
  if (actual != crc) {
    return absl::DataLossError(
        absl::StrCat(what, " is corrupt: its CRC-32C is ", actual, ", its trailer says ", crc));
  }
  return absl::OkStatus();
}

absl::Status VerifyTransfer(FILE* f, const std::string& what) {
  const auto io_error = [&](absl::string_view op) {
    return absl::InternalError(absl::StrCat(op, " ", what, ": ", std::strerror(errno)));
  };
  if (std::fseek(f, 0, SEEK_END) != 0) return io_error("seeking in");
  const long size = std::ftell(f);
  if (size < static_cast<long>(sizeof kTransferMagic + kTransferTrailer)) {
    return TooShort(what, static_cast<uint64_t>(std::max(size, 0L)));
  }
  char head[sizeof kTransferMagic + sizeof(uint32_t)];
  std::rewind(f);
  if (std::fread(head, 1, sizeof head, f) != sizeof head) return io_error("reading");
  if (absl::Status st = CheckVersion(head, what); !st.ok()) return st;
  char trailer[kTransferTrailer];
  std::fseek(f, size - static_cast<long>(kTransferTrailer), SEEK_SET);
  if (std::fread(trailer, 1, sizeof trailer, f) != sizeof trailer) return io_error("reading");
  std::rewind(f);
  std::vector<char> buffer(size_t{1} << 20);
  uint32_t actual = 0;
  for (uint64_t left = static_cast<uint64_t>(size) - kTransferTrailer; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buffer.size()));
    if (std::fread(buffer.data(), 1, n, f) != n) return io_error("reading");
    actual = Crc32c(actual, buffer.data(), n);
    left -= n;
  }
  std::rewind(f);
  return CheckTransferTrailer(trailer, static_cast<uint64_t>(size), actual, what);
}

absl::Status VerifyTransfer(absl::string_view bytes, const std::string& what) {
  if (bytes.size() < sizeof kTransferMagic + kTransferTrailer) return TooShort(what, bytes.size());
  if (absl::Status st = CheckVersion(bytes.data(), what); !st.ok()) return st;
  const size_t body = bytes.size() - kTransferTrailer;
  return CheckTransferTrailer(bytes.data() + body, bytes.size(), Crc32c(0, bytes.data(), body),
                              what);
}

}  // namespace attnserve::server::sessions
