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

// `file` is main's __FILE__: ABSL_FLAG records the same string for the flags it defines there.
inline void ShowFlagsOfFileInHelp(absl::string_view file) {
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = [main_file = std::string(file)](absl::string_view f) {
    return f == main_file;
  };
  config.contains_help_flags = config.contains_helpshort_flags;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace attnserve

#endif  // ATTNSERVE_BASE_FLAGS_USAGE_H_
