#include "server/sessions/session_codec.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace attnserve::server::sessions {

uint32_t Crc32(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {  // zlib takes a uInt length
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, chunk));
    p += chunk;
    n -= chunk;
  }
  return crc;
}

uint32_t ModuleChecksum(const kernels::MultiHeadWeights& w) {
  uint32_t crc = Crc32(0, &w.d_model, sizeof w.d_model);
  crc = Crc32(crc, &w.num_heads, sizeof w.num_heads);
  for (const std::vector<float>* v : {&w.w_qkv, &w.b_qkv, &w.w_o, &w.b_o}) {
    crc = Crc32(crc, v->data(), v->size() * sizeof(float));
  }
  return crc;
}

void TransferWriter::Put(const void* data, size_t n) {
  if (!ok_) return;
  crc_ = Crc32(crc_, data, n);
  bytes_ += n;
  if (f_ != nullptr) {
    ok_ = std::fwrite(data, 1, n, f_) == n;
  } else {
    out_->append(static_cast<const char*>(data), n);
  }
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

// Checks the trailer (the last kTransferTrailer bytes of `size`) against the CRC `actual` of
// the bytes before it.
absl::Status CheckTrailer(const char* trailer, uint64_t size, uint32_t actual,
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
        absl::StrCat(what, " is corrupt: its CRC-32 is ", actual, ", its trailer says ", crc));
  }
  return absl::OkStatus();
}

absl::Status TooShort(const std::string& what, uint64_t size) {
  return absl::DataLossError(
      absl::StrCat(what, " is torn: ", size, " bytes, shorter than its header and trailer"));
}

}  // namespace

absl::Status VerifyTransfer(FILE* f, const std::string& what) {
  const auto io_error = [&](absl::string_view op) {
    return absl::InternalError(absl::StrCat(op, " ", what, ": ", std::strerror(errno)));
  };
  if (std::fseek(f, 0, SEEK_END) != 0) return io_error("seeking in");
  const long size = std::ftell(f);
  if (size < static_cast<long>(sizeof kTransferMagic + kTransferTrailer)) {
    return TooShort(what, static_cast<uint64_t>(std::max(size, 0L)));
  }
  char trailer[kTransferTrailer];
  std::fseek(f, size - static_cast<long>(kTransferTrailer), SEEK_SET);
  if (std::fread(trailer, 1, sizeof trailer, f) != sizeof trailer) return io_error("reading");
  std::rewind(f);
  std::vector<char> buffer(size_t{1} << 20);
  uint32_t actual = 0;
  for (uint64_t left = static_cast<uint64_t>(size) - kTransferTrailer; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buffer.size()));
    if (std::fread(buffer.data(), 1, n, f) != n) return io_error("reading");
    actual = Crc32(actual, buffer.data(), n);
    left -= n;
  }
  std::rewind(f);
  return CheckTrailer(trailer, static_cast<uint64_t>(size), actual, what);
}

absl::Status VerifyTransfer(absl::string_view bytes, const std::string& what) {
  if (bytes.size() < sizeof kTransferMagic + kTransferTrailer) return TooShort(what, bytes.size());
  const size_t body = bytes.size() - kTransferTrailer;
  return CheckTrailer(bytes.data() + body, bytes.size(), Crc32(0, bytes.data(), body), what);
}

}  // namespace attnserve::server::sessions
