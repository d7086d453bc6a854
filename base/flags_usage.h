// --help that lists a binary's own flags. Abseil's default shows only the flags defined in a
// file named after the program (attnserve.cc, attnserve-main.cc, ...), so for flags defined in
// server/main.cc it printed "No flags matched". Call from main, before absl::ParseCommandLine:
//
//   attnserve::ShowFlagsOfFileInHelp(__FILE__);
//
// --help and --helpshort then list the flags ABSL_FLAG defined in that file, each with its
// default; --helpfull still lists every flag of the binary (gRPC's and Abseil's too).
#ifndef ATTNSERVE_BASE_FLAGS_USAGE_H_
#define ATTNSERVE_BASE_FLAGS_USAGE_H_

#include <string>

#include "absl/flags/usage_config.h"
#include "absl/strings/string_view.h"

namespace attnserve {

// A source file's name as --help shows it and as the filter below compares it: without leading
// slashes (Abseil's own default). The filter is handed CommandLineFlag::Filename(), which is
// __FILE__ after normalize_filename, while main's __FILE__ arrives raw: an absolute path
// ("/src/attnserve/server/main.cc", as a plain build compiles it) matched nothing, and
// --help listed no flags. Both sides now go through this one function.
inline std::string NormalizeFlagFilename(absl::string_view file) {
  const size_t start = file.find_first_not_of("/\\");
  return start == absl::string_view::npos ? std::string() : std::string(file.substr(start));
}

// The filter --help and --helpshort use: true for flags defined in `main_file` (main's __FILE__).
inline bool IsFlagOfFile(absl::string_view main_file, absl::string_view flag_file) {
  return NormalizeFlagFilename(flag_file) == NormalizeFlagFilename(main_file);
}

// `file` is main's __FILE__: ABSL_FLAG records the same string for the flags it defines there.
inline void ShowFlagsOfFileInHelp(absl::string_view file) {
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = [main_file = std::string(file)](absl::string_view f) {
    return IsFlagOfFile(main_file, f);
  };
  config.contains_help_flags = config.contains_helpshort_flags;
  config.normalize_filename = [](absl::string_view f) { return NormalizeFlagFilename(f); };
  absl::SetFlagsUsageConfig(config);
}

}  // namespace attnserve

#endif  // ATTNSERVE_BASE_FLAGS_USAGE_H_
