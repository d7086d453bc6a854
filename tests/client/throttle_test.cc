// client/throttle.h: the cases every client's throttle must pass identically
// (tests/testing/throttle_cases.json; the Python and Node.js clients run the same file) on a
// fake clock and fake draws, the options' checks, the pushback's parsing, and Client against a
// fake in-process service: a pushback holds compute calls back (nothing sent), answers that
// are not overload never throttle, control calls are never throttled, and a client with the
// throttle off sends everything.
#include "client/throttle.h"

#include <atomic>
#include <deque>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "client/client.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace attnserve {
namespace {

constexpr char kAdvice[] = "; retry later or disable with ClientOptions::throttle.enabled = false";

absl::StatusCode CodeNamed(const std::string& name) {
  for (int c = 0; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    std::string upper = absl::StatusCodeToString(code);
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (upper == name) return code;
  }
  ADD_FAILURE() << "no status code named " << name;
  return absl::StatusCode::kUnknown;
}

TEST(ThrottleTest, SharedCases) {
  std::ifstream in(ATTNSERVE_THROTTLE_CASES);
  ASSERT_TRUE(in) << ATTNSERVE_THROTTLE_CASES;
  const nlohmann::json cases = nlohmann::json::parse(in)["cases"];
  ASSERT_GT(cases.size(), 10u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    double now = 0;
    std::deque<double> draws;
    bool drew_unexpectedly = false;
    ThrottleOptions options;
    options.enabled = c.value("enabled", true);
    options.k = c.value("k", 2.0);
    options.window_seconds = c.value("window_seconds", 30);
    options.max_probability = c.value("max_probability", 0.95);
    auto throttle = Throttle::Create(
                        options, [&] { return now; },
                        [&] {
                          if (draws.empty()) {
                            drew_unexpectedly = true;
                            return 0.0;
                          }
                          const double d = draws.front();
                          draws.pop_front();
                          return d;
                        })
                        .value();
    int i = 0;
    for (const auto& e : c["events"]) {
      SCOPED_TRACE("event " + std::to_string(i++) + " " + e.dump());
      now = e["t"].get<double>();
      if (e.contains("p")) {
        EXPECT_NEAR(throttle->Probability(), e["p"].get<double>(), 1e-9);
      }
      if (e.contains("requests") || e.contains("accepts")) {
        const auto [requests, accepts] = throttle->Counts();
        EXPECT_EQ(requests, e["requests"].get<int64_t>());
        EXPECT_EQ(accepts, e["accepts"].get<int64_t>());
      }
      if (e.contains("record")) {
        const std::string pushback = e.contains("pushback") ? e["pushback"].get<std::string>() : "";
        for (int n = 0; n < e.value("times", 1); ++n) {
          throttle->Record(CodeNamed(e["record"].get<std::string>()), pushback);
        }
      }
      if (e.contains("check")) {
        if (e.contains("rand")) draws.push_back(e["rand"].get<double>());
        const std::optional<std::string> why = throttle->Check();
        EXPECT_TRUE(draws.empty()) << "the draw given was not taken";
        EXPECT_FALSE(drew_unexpectedly) << "a draw was taken where none was expected";
        draws.clear();
        drew_unexpectedly = false;
        const std::string want = e["check"].get<std::string>();
        if (want == "send") {
          EXPECT_FALSE(why.has_value()) << *why;
        } else {
          ASSERT_TRUE(why.has_value());
          if (e.contains("message")) {
            EXPECT_EQ(*why, e["message"].get<std::string>() + kAdvice);
          }
          EXPECT_EQ(why->find("asked for no calls") != std::string::npos, want == "pushback");
          // As a client answers it: throttled by the client either way, held by a pushback
          // only during one.
          const absl::Status answer = absl::UnavailableError(*why);
          EXPECT_TRUE(IsThrottledByClient(answer));
          EXPECT_EQ(IsHeldByPushback(answer), want == "pushback");
        }
      }
    }
  }
}

TEST(ThrottleTest, OptionsAreChecked) {
  ThrottleOptions options;
  options.k = 0.5;
  EXPECT_EQ(ValidateThrottleOptions(options).message(), "throttle.k must be >= 1; was 0.5");
  options.k = std::nan("");
  EXPECT_EQ(ValidateThrottleOptions(options).message(), "throttle.k must be >= 1; was NaN");
  options.k = HUGE_VAL;
  EXPECT_EQ(ValidateThrottleOptions(options).message(), "throttle.k must be finite; was Infinity");
  options.k = 2;
  const std::pair<double, const char*> bad[] = {
      {0.0, "0"}, {-0.5, "-0.5"}, {1.5, "1.5"}, {std::nan(""), "NaN"}};
  for (const auto& [value, shown] : bad) {
    options.max_probability = value;
    EXPECT_EQ(ValidateThrottleOptions(options).message(),
              std::string("throttle.max_probability must be above 0 and at most 1; was ") + shown);
  }
  options.max_probability = 1;
  EXPECT_TRUE(ValidateThrottleOptions(options).ok());
  options.window_seconds = 0;
  options.enabled = false;  // checked all the same
  EXPECT_EQ(ValidateThrottleOptions(options).message(),
            "throttle.window_seconds must be an integer >= 1; was 0");
  EXPECT_EQ(Throttle::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  ClientOptions client_options;
  client_options.throttle = options;
  EXPECT_EQ(Client::Create("localhost:1", client_options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ThrottleTest, PushbackParsing) {
  EXPECT_EQ(ParsePushback("0"), 0);
  EXPECT_EQ(ParsePushback("1500"), 1500);
  EXPECT_EQ(ParsePushback(""), std::nullopt);
  EXPECT_EQ(ParsePushback("-5"), std::nullopt);
  EXPECT_EQ(ParsePushback("+5"), std::nullopt);
  EXPECT_EQ(ParsePushback("5 "), std::nullopt);
  EXPECT_EQ(ParsePushback("1.5"), std::nullopt);
  EXPECT_EQ(ParsePushback("-9223372036854775808"), std::nullopt);  // gRPC's "unparseable"
  EXPECT_EQ(ParsePushback("99999999999999999999"), std::nullopt);  // past int64
}

// Answers every compute call with `code` (and the pushback trailer when set), counting them.
class RefusingService final : public v1::AttentionService::Service {
 public:
  RefusingService(grpc::StatusCode code, std::string pushback)
      : code_(code), pushback_(std::move(pushback)) {}
  grpc::Status Attend(grpc::ServerContext* context, const v1::AttendRequest*,
                      v1::AttendResponse*) override {
    return Answer(context);
  }
  grpc::Status MultiHeadAttention(grpc::ServerContext* context,
                                  const v1::MultiHeadAttentionRequest*,
                                  v1::MultiHeadAttentionResponse*) override {
    return Answer(context);
  }
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest*,
                             v1::GetServerInfoResponse*) override {
    return Answer(context);
  }
  int calls() const { return calls_.load(); }

 private:
  grpc::Status Answer(grpc::ServerContext* context) {
    calls_.fetch_add(1);
    if (!pushback_.empty()) context->AddTrailingMetadata(kPushbackKey, pushback_);
    return grpc::Status(code_, "refused by the fake");
  }
  const grpc::StatusCode code_;
  const std::string pushback_;
  std::atomic<int> calls_{0};
};

struct Fake {
  Fake(grpc::StatusCode code, std::string pushback) : service(code, std::move(pushback)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Fake() { server->Shutdown(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  RefusingService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

TEST(ClientThrottleTest, PushbackHoldsComputeCallsBackWithoutSending) {
  // An hour: no test run outlasts it, so the decision does not depend on timing.
  Fake fake(grpc::StatusCode::UNAVAILABLE, "3600000");
  auto client = Client::Create(fake.address()).value();
  ASSERT_NE(client->throttle(), nullptr);
  EXPECT_EQ(client->Attend(v1::AttendRequest()).status().message(), "refused by the fake");
  EXPECT_EQ(fake.service.calls(), 1);
  for (int i = 0; i < 5; ++i) {
    const absl::Status s = client->MultiHeadAttention(v1::MultiHeadAttentionRequest()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(IsHeldByPushback(s)) << s;
    EXPECT_EQ(s.message(),
              std::string("throttled by the client: the server asked for no calls for 3600000 ms "
                          "(grpc-retry-pushback-ms)") +
                  kAdvice);
  }
  // The async forms are held back too, answering at once.
  const absl::Status async = client->AttendAsync(v1::AttendRequest()).get().status();
  EXPECT_TRUE(absl::StartsWith(async.message(), "throttled by the client")) << async;
  EXPECT_EQ(fake.service.calls(), 1);
  // Control calls are never throttled (nor counted).
  const auto [requests, accepts] = client->throttle()->Counts();
  EXPECT_EQ(client->GetServerInfo().status().message(), "refused by the fake");
  EXPECT_EQ(fake.service.calls(), 2);
  EXPECT_EQ(client->throttle()->Counts(), std::make_pair(requests, accepts));
}

TEST(ClientThrottleTest, AnswersThatAreNotOverloadNeverThrottle) {
  Fake fake(grpc::StatusCode::INVALID_ARGUMENT, "");
  auto client = Client::Create(fake.address()).value();
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(client->Attend(v1::AttendRequest()).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(fake.service.calls(), 50);
  EXPECT_FALSE(IsThrottledByClient(client->Attend(v1::AttendRequest()).status()));
  EXPECT_EQ(client->throttle()->Counts(), std::make_pair(int64_t{51}, int64_t{51}));
  EXPECT_EQ(client->throttle()->Probability(), 0.0);
}

TEST(ClientThrottleTest, OffSendsEverything) {
  Fake fake(grpc::StatusCode::UNAVAILABLE, "3600000");
  ClientOptions options;
  options.throttle.enabled = false;
  auto client = Client::Create(fake.address(), options).value();
  EXPECT_EQ(client->throttle(), nullptr);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(client->Attend(v1::AttendRequest()).status().message(), "refused by the fake");
  }
  EXPECT_EQ(fake.service.calls(), 20);
}

}  // namespace
}  // namespace attnserve
