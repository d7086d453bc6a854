// The session transfer format's pieces (server/sessions/session_codec.h): its checksum against
// the standard's check value, chained, and by both implementations; a transfer's trailer verified.
#include "server/sessions/session_codec.h"

#include <cstring>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace attnserve::server::sessions {
namespace {

TEST(SessionCodecTest, Crc32cIsCastagnolisCrcChainedAndEqualByBothImplementations) {
  // The check value of CRC-32C (RFC 3720, appendix B.4): "123456789".
  const std::string check = "123456789";
  EXPECT_EQ(Crc32c(0, check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(Crc32cPortable(0, check.data(), check.size()), 0xE3069283u);
  // 32 bytes of zeros (RFC 3720, B.4).
  const std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(0, zeros.data(), zeros.size()), 0x8A9136AAu);
  // Chained over any split, equal by both, at every length and alignment up to 100 bytes.
  std::mt19937 rng(7);
  std::string bytes(1000, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  for (size_t n = 0; n < 100; ++n) {
    for (size_t offset = 0; offset < 9; ++offset) {
      const char* p = bytes.data() + offset;
      const uint32_t whole = Crc32c(0, p, n);
      EXPECT_EQ(Crc32cPortable(0, p, n), whole) << n << " " << offset;
      const size_t cut = n / 3;
      EXPECT_EQ(Crc32c(Crc32c(0, p, cut), p + cut, n - cut), whole) << n << " " << offset;
    }
  }
}

TEST(SessionCodecTest, ATransferIsVerifiedByItsTrailer) {
  std::string transfer;
  TransferWriter w(&transfer);
  w.Put(kTransferMagic, sizeof kTransferMagic);
  w.Num(kTransferVersion);
  w.Str("replica");
  char* room = w.Reserve(5);
  std::memcpy(room, "bytes", 5);
  w.Commit();
  w.Trailer();
  EXPECT_TRUE(VerifyTransfer(transfer, "t").ok());
  std::string flipped = transfer;
  flipped[14] ^= 1;
  EXPECT_EQ(VerifyTransfer(flipped, "t").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(VerifyTransfer(transfer.substr(0, transfer.size() - 1), "t").code(),
            absl::StatusCode::kDataLoss);
  std::string old = transfer;
  old[8] = 1;  // format version 1
  EXPECT_EQ(VerifyTransfer(old, "t").code(), absl::StatusCode::kFailedPrecondition);
  TransferReader r(transfer);
  char magic[sizeof kTransferMagic];
  ASSERT_TRUE(r.Get(magic, sizeof magic));
  EXPECT_EQ(r.Num<uint32_t>(), kTransferVersion);
  EXPECT_EQ(r.Str(), "replica");
  char got[5];
  ASSERT_TRUE(r.Get(got, 5));
  EXPECT_EQ(std::string(got, 5), "bytes");
}

}  // namespace
}  // namespace attnserve::server::sessions
