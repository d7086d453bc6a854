#include "model/safetensors.h"

#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/model/safetensors_bytes.h"

namespace attnserve::model {
namespace {

using ::testing::HasSubstr;

std::string Floats(std::initializer_list<float> values) {
  std::string s(values.size() * 4, '\0');
  size_t i = 0;
  for (float v : values) std::memcpy(&s[4 * i++], &v, 4);
  return s;
}

TEST(SafetensorsTest, ParsesTensorsAndMetadata) {
  const std::string f = File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("__metadata__":{"num_heads":"4"}})",
                             Floats({1.5f, -2.0f}));
  auto parsed = ParseSafetensors(f);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->metadata.at("num_heads"), "4");
  auto a = parsed->Find("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->shape, std::vector<int64_t>{2});
  EXPECT_EQ((*a)->ToFloat32("a").value(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(parsed->Find("b").status().code(), absl::StatusCode::kNotFound);
}

struct BadCase {
  const char* name;
  std::string file;
  const char* expected;
};

TEST(SafetensorsTest, MalformedFilesAreRejectedWithClearErrors) {
  const std::string one = Floats({1.0f});
  const BadCase cases[] = {
      {"too short", "abc", "at least 8 needed"},
      {"header past end", File("{}", "").substr(0, 8) + "{", "exceeds the file"},
      {"not json", File("{not json", ""), "not valid JSON"},
      {"not object", File("[1,2]", ""), "not a JSON object"},
      {"no dtype", File(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", one), "no string 'dtype'"},
      {"unknown dtype", File(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", one),
       "unknown dtype Q7"},
      {"negative dim", File(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", one),
       "not a non-negative integer"},
      {"overflowing shape",
       File(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", one),
       "shape overflows"},
      {"offsets past data", File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", one),
       "outside the data buffer"},
      {"offsets reversed", File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", one),
       "outside the data buffer"},
      {"size mismatch", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", one),
       "need 8"},
      {"bad metadata", File(R"({"__metadata__":{"k":1}})", ""), "is not a string"},
      // The layout rule: the tensors tile the data buffer exactly.
      {"same offsets",
       File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
            one),
       "tensor 'b' data_offsets [0, 4) overlap those of tensor 'a' (which end at 4)"},
      {"partial overlap",
       File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            Floats({1, 2, 3})),
       "tensor 'b' data_offsets [4, 12) overlap those of tensor 'a' (which end at 8)"},
      {"hole between",
       File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            Floats({1, 2, 3})),
       "tensor 'b' data_offsets [8, 12) leave bytes [4, 8) of the data buffer to no tensor"},
      {"hole first",
       File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", Floats({1, 2})),
       "tensor 'a' data_offsets [4, 8) leave bytes [0, 4)"},
      {"trailing bytes",
       File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", one + "xyz"),
       "the data buffer has 3 bytes after the last tensor's"},
      {"data without tensors", File("{}", "x"), "has 1 bytes after"},
      {"duplicate tensor",
       File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            Floats({1, 2})),
       "the key 'a' twice in one object"},
      {"duplicate field",
       File(R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", one),
       "the key 'dtype' twice"},
      {"duplicate metadata", File(R"({"__metadata__":{"k":"1","k":"2"}})", ""),
       "the key 'k' twice"},
      {"too deep", File(R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", one),
       "nests JSON deeper than the format's 3 levels"},
      {"deep arrays", File(std::string(100000, '[') + std::string(100000, ']'), ""),
       "nests JSON deeper"},
  };
  for (const BadCase& c : cases) {
    auto parsed = ParseSafetensors(c.file);
    ASSERT_FALSE(parsed.ok()) << c.name;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.expected)) << c.name;
  }
}

TEST(SafetensorsTest, TensorsInAnyOrderTilingTheBufferAreAccepted) {
  // Listed out of offset order, with an empty tensor between two others and one at the end.
  const std::string f = File(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                             R"("e":{"dtype":"F16","shape":[0],"data_offsets":[4,4]},)"
                             R"("z":{"dtype":"F32","shape":[0,3],"data_offsets":[8,8]},)"
                             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                             Floats({1.0f, 2.0f}));
  auto parsed = ParseSafetensors(f);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors.size(), 4u);
  EXPECT_EQ((*parsed->Find("b"))->ToFloat32("b").value(), std::vector<float>{2.0f});
  // Empty tensors convert to nothing (fuzz_safetensors found the null memcpy this once was).
  EXPECT_TRUE((*parsed->Find("z"))->ToFloat32("z").value().empty());
  EXPECT_TRUE((*parsed->Find("e"))->ToFloat32("e").value().empty());
  // No tensors and no data is a valid (empty) file.
  EXPECT_TRUE(ParseSafetensors(File("{}", "")).ok());
}

}  // namespace
}  // namespace attnserve::model
