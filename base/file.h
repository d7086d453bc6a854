// Reading a whole file into memory: module weights at start-up, TLS keys and tokens, seed
// vectors in tests and the cli, /proc and /sys files.
//
// Thread-safety: a pure function of the file system.
#ifndef ATTNSERVE_BASE_FILE_H_
#define ATTNSERVE_BASE_FILE_H_

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace attnserve {

// The bytes of the file at `path`: NOT_FOUND when it cannot be opened, DATA_LOSS when a read
// fails part way. Both name the path.
inline absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in.good() && !in.eof()) return absl::DataLossError(absl::StrCat("cannot read '", path, "'"));
  return std::move(ss).str();
}

// The bytes of the file at `path`, or "" when it cannot be read: for /proc and /sys files,
// where a file that is not there (no cgroup limit, no such controller) means nothing to add.
// Read by stream, as ReadFileToString reads, so /proc files (which report size 0) come whole.
inline std::string ReadFileOrEmpty(const std::string& path) {
  return ReadFileToString(path).value_or("");
}

}  // namespace attnserve

#endif  // ATTNSERVE_BASE_FILE_H_
