// The transfer format of sessions: one replica's sessions as bytes, for a snapshot on local disk
// (session_snapshot.cc: across a restart) and for a move to another replica (session_move.cc,
// the AcceptSessions rpc). Little-endian:
//
//   "ATTNSNP1"  u32 version (3)  str owner  u32 page_tokens
//   u32 layouts   { i32 num_kv_heads, head_dim, v_head_dim  u8 dtype }
//   u64 records   { u32 layout  K bytes (k_page_bytes)  V bytes (v_page_bytes) }   a page
//                 { u32 kMoreRecords  u64 n }     n more records follow (a move's pre-copy)
//   u64 sessions  { str id, tenant, module  u32 module checksum  i32 num_heads  u32 layout
//                   u8 cache dtype  f32 scale  i32 window_left  f32 softcap  u32 n  f32 slopes[n]
//                   u8 kind  u8 feature map  u8 pinned  i64 ttl_us  str parent  i64 length
//                   i64 dropped  u32 n  u64 page[n] (an index above, or kNoPage: dropped)
//                   u32 n  str alias[n] (version 3: its ids on replicas it moved from) }
//   "ATTNEND!"  u64 bytes before the trailer  u32 CRC-32C of them
//
// (str: u32 length, then the bytes.) A page forks share is written once. Pages are numbered in
// the order they come; a move writes the pages it pre-copied while the session went on (one
// record more, the kMoreRecords that counts the rest), then those written since. The trailer's
// length and checksum are verified over the whole transfer before anything is taken from it: a
// torn one (a disk that lies, a connection cut) or a corrupt one is refused whole, DATA_LOSS.
#ifndef ATTNSERVE_SERVER_SESSIONS_SESSION_CODEC_H_
#define ATTNSERVE_SERVER_SESSIONS_SESSION_CODEC_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/multi_head.h"

namespace attnserve::server::sessions {

inline constexpr char kTransferMagic[8] = {'A', 'T', 'T', 'N', 'S', 'N', 'P', '1'};
inline constexpr char kTransferEnd[8] = {'A', 'T', 'T', 'N', 'E', 'N', 'D', '!'};
// Version 2: CRC-32C (the SSE4.2 instruction: 7.5 GB/s here, zlib's CRC-32 3.6 GB/s, and a
// move computes it on both replicas). Version 3: kMoreRecords, aliases. Versions 2 and 3 are read
// (a snapshot of the release before this one comes back); version 1 (zlib's CRC-32) is refused,
// naming it.
inline constexpr uint32_t kTransferVersion = 3;
inline constexpr uint32_t kOldestTransferVersion = 2;
inline constexpr uint32_t kMoreRecords = ~uint32_t{0};
inline constexpr uint64_t kNoPage = ~uint64_t{0};
// The trailer: kTransferEnd, the length before it, the CRC-32C.
inline constexpr size_t kTransferTrailer =
    sizeof kTransferEnd + sizeof(uint64_t) + sizeof(uint32_t);

// CRC-32C (Castagnoli) of `n` more bytes, chained as zlib's crc32 is (start from 0): the SSE4.2
// instruction where the CPU has it (every CPU this project targets), else a table.
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);
// The same by the table alone (what a CPU without SSE4.2 runs; tests compare the two).
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);
// The weights' checksum: a module session comes back only to the same weights.
uint32_t ModuleChecksum(const kernels::MultiHeadWeights& w);

// Buffered writes, to a file or to memory, with a running CRC.
class TransferWriter {
 public:
  explicit TransferWriter(FILE* f) : f_(f) {}
  explicit TransferWriter(std::string* out) : out_(out) {}
  void Put(const void* data, size_t n);
  template <typename T>
  void Num(T v) {
    Put(&v, sizeof v);
  }
  void Str(const std::string& s) {
    Num(static_cast<uint32_t>(s.size()));
    Put(s.data(), s.size());
  }
  // Room for `n` bytes the caller writes, then Commit (which counts and checksums them) before
  // anything else is put.
  char* Reserve(size_t n);
  void Commit();
  // Writes the trailer (the length and CRC of everything put so far).
  void Trailer();
  bool ok() const { return ok_; }
  uint64_t bytes() const { return bytes_; }

 private:
  FILE* f_ = nullptr;
  std::string* out_ = nullptr;
  bool ok_ = true;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
  std::vector<char> scratch_;  // a file's reserved bytes
  size_t reserved_ = 0;
};

// Reads of a verified transfer, from a file or from memory; a read past its end (a transfer
// that lies about its contents while its checksum holds: a bug, not a disk) fails.
class TransferReader {
 public:
  explicit TransferReader(FILE* f) : f_(f) {}
  explicit TransferReader(absl::string_view bytes) : bytes_(bytes) {}
  bool Get(void* data, size_t n);
  template <typename T>
  T Num() {
    T v{};
    Get(&v, sizeof v);
    return v;
  }
  std::string Str();
  bool ok() const { return ok_; }
  // Bytes read so far.
  uint64_t position() const { return position_; }

 private:
  FILE* f_ = nullptr;
  absl::string_view bytes_;
  bool ok_ = true;
  uint64_t position_ = 0;
};

// Checks a transfer's trailer (`trailer`, its last kTransferTrailer bytes of `size`) against
// `actual`, the CRC of the bytes before it: DATA_LOSS naming `what` when torn or corrupt.
absl::Status CheckTransferTrailer(const char* trailer, uint64_t size, uint32_t actual,
                                  const std::string& what);
// Verifies a transfer's trailer against it: its length and the CRC of everything before it.
// DATA_LOSS naming `what` when torn or corrupt. The file is left at its start.
absl::Status VerifyTransfer(FILE* f, const std::string& what);
absl::Status VerifyTransfer(absl::string_view bytes, const std::string& what);

}  // namespace attnserve::server::sessions

#endif  // ATTNSERVE_SERVER_SESSIONS_SESSION_CODEC_H_
