#include "model/module_weights.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/safetensors.h"
#include "tests/model/safetensors_bytes.h"

namespace attnserve::model {
namespace {

using ::testing::HasSubstr;

// A module file with d_model d (all weights zero), stacking each tensor after the previous one.
std::string ModuleFile(int d, const std::string& metadata, const std::string& skip = "") {
  std::string header = "{";
  std::string data;
  for (const char* p : {"W_q", "W_k", "W_v", "W_o"}) {
    for (const char* kind : {"weight", "bias"}) {
      const std::string name = std::string(p) + "." + kind;
      if (name == skip) continue;
      const bool weight = std::string(kind) == "weight";
      const size_t n = weight ? d * d : d;
      const size_t begin = data.size();
      data += std::string(n * 4, '\0');
      header += "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":" +
                (weight ? "[" + std::to_string(d) + "," + std::to_string(d) + "]"
                        : "[" + std::to_string(d) + "]") +
                ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(data.size()) +
                "]},";
    }
  }
  header += "\"__metadata__\":{" + metadata + "}}";
  return File(header, data);
}

TEST(WeightsFromSafetensorsTest, ReadsNumHeadsFromArgumentOrMetadata) {
  const std::string f = ModuleFile(4, R"("num_heads":"2")");
  auto parsed = ParseSafetensors(f);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto w = WeightsFromSafetensors(*parsed, 0);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->d_model, 4);
  EXPECT_EQ(w->num_heads, 2);
  EXPECT_EQ(WeightsFromSafetensors(*parsed, 4).value().num_heads, 4);
}

TEST(WeightsFromSafetensorsTest, StacksQkvAndConvertsEachDtype) {
  // d_model 1: each tensor one element, in F32, F16 or BF16 (little-endian bytes).
  struct Entry {
    const char* name;
    const char* dtype;
    std::string bytes;
  };
  auto f32 = [](float v) {
    std::string b(4, '\0');
    std::memcpy(b.data(), &v, 4);
    return b;
  };
  auto u16 = [](uint16_t bits) {
    return std::string{static_cast<char>(bits & 0xff), static_cast<char>(bits >> 8)};
  };
  const Entry entries[] = {
      {"W_q.weight", "F32", f32(1.5f)},     // 1.5
      {"W_q.bias", "F16", u16(0x3c00)},     // 1.0
      {"W_k.weight", "BF16", u16(0x4000)},  // 2.0
      {"W_k.bias", "F32", f32(-3.0f)},      // -3.0
      {"W_v.weight", "F16", u16(0xc400)},   // -4.0
      {"W_v.bias", "BF16", u16(0x40a0)},    // 5.0
      {"W_o.weight", "F32", f32(0.25f)},    // 0.25
      {"W_o.bias", "F16", u16(0x4600)},     // 6.0
  };
  std::string header = "{", data;
  for (const Entry& e : entries) {
    const bool weight = std::string(e.name).find("weight") != std::string::npos;
    const size_t begin = data.size();
    data += e.bytes;
    header += "\"" + std::string(e.name) + "\":{\"dtype\":\"" + e.dtype +
              "\",\"shape\":" + (weight ? "[1,1]" : "[1]") + ",\"data_offsets\":[" +
              std::to_string(begin) + "," + std::to_string(data.size()) + "]},";
  }
  header.back() = '}';
  const std::string bytes = File(header, data);
  auto parsed = ParseSafetensors(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto w = WeightsFromSafetensors(*parsed, 1);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->w_qkv, (std::vector<float>{1.5f, 2.0f, -4.0f}));
  EXPECT_EQ(w->b_qkv, (std::vector<float>{1.0f, -3.0f, 5.0f}));
  EXPECT_EQ(w->w_o, std::vector<float>{0.25f});
  EXPECT_EQ(w->b_o, std::vector<float>{6.0f});
}

TEST(WeightsFromSafetensorsTest, RejectsMissingTensorsAndBadHeads) {
  // The parsed files hold views into their buffers, which must outlive them.
  const std::string missing_bytes = ModuleFile(4, R"("num_heads":"2")", "W_v.bias");
  auto missing = ParseSafetensors(missing_bytes);
  ASSERT_TRUE(missing.ok());
  EXPECT_THAT(WeightsFromSafetensors(*missing, 0).status().message(), HasSubstr("W_v.bias"));

  const std::string three_heads = ModuleFile(4, R"("num_heads":"3")");
  auto f = ParseSafetensors(three_heads);
  ASSERT_TRUE(f.ok());
  auto bad = WeightsFromSafetensors(*f, 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("divisible"));

  const std::string no_heads = ModuleFile(4, "");
  auto none = ParseSafetensors(no_heads);
  ASSERT_TRUE(none.ok());
  EXPECT_THAT(WeightsFromSafetensors(*none, 0).status().message(), HasSubstr("num_heads"));
}

}  // namespace
}  // namespace attnserve::model
