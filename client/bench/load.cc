#include "client/bench/load.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_format.h"
#include "base/mutex.h"
#include "client/stream.h"

namespace attnserve::bench {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<double> RampLevels(double from, double to, int steps) {
  std::vector<double> out;
  if (steps <= 1) return {to};
  for (int i = 0; i < steps; ++i) out.push_back(from + (to - from) * i / (steps - 1));
  return out;
}

namespace {

void SleepUntilNs(int64_t t) {
  const int64_t now = NowNs();
  if (t > now) std::this_thread::sleep_for(std::chrono::nanoseconds(t - now));
}

// A call's Sample::code: its canonical code, or kThrottledCode when the client's own throttle
// rejected it (kHeldByPushbackCode: during a server's pushback).
int SampleCode(const absl::Status& status) {
  if (IsHeldByPushback(status)) return kHeldByPushbackCode;
  return IsThrottledByClient(status) ? kThrottledCode : static_cast<int>(status.code());
}

void FillTiming(const v1::Timing& t, Sample* s) {
  s->queued_us = t.queued_us();
  s->compute_us = t.compute_us();
  s->server_us = t.server_us();
  s->batch_size = t.batch_size();
}

// A random engine per thread: draws happen on gRPC completion threads too.
std::mt19937_64& Rng(uint64_t seed) {
  thread_local std::mt19937_64 rng(seed ^ std::hash<std::thread::id>()(std::this_thread::get_id()));
  return rng;
}

}  // namespace

// The streams of rpc = kStream, with the requests each has in flight by id.
class Driver::StreamPool {
 public:
  StreamPool(Client& client, int n) {
    for (int i = 0; i < n; ++i) {
      streams_.push_back(
          client.OpenStream([this](v1::AttentionStreamResponse r) { OnResponse(std::move(r)); }));
    }
  }
  ~StreamPool() {
    for (auto& s : streams_) s->CloseSend();
    for (auto& s : streams_) s->Finish().IgnoreError();
  }
  void Send(const Prepared& p, uint32_t item, int64_t intended_ns, Done done) {
    const uint64_t id = next_id_.fetch_add(1);
    {
      MutexLock lock(&mu_);
      pending_[id] = Pending{intended_ns, item, std::move(done)};
    }
    AttentionStream& s = *streams_[id % streams_.size()];
    const bool sent = p.attend ? s.Send(id, *p.attend) : s.Send(id, *p.mha);
    if (!sent) {  // the stream ended: report its status as this request's
      Sample sample;
      sample.code = static_cast<int>(absl::StatusCode::kUnavailable);
      Complete(id, &sample);
    }
  }

 private:
  struct Pending {
    int64_t intended_ns;
    uint32_t item;
    Done done;
  };
  void OnResponse(v1::AttentionStreamResponse r) {
    Sample s;
    s.code = r.code();
    if (r.has_attend()) FillTiming(r.attend().timing(), &s);
    if (r.has_multi_head_attention()) FillTiming(r.multi_head_attention().timing(), &s);
    Complete(r.request_id(), &s);
  }
  void Complete(uint64_t id, Sample* s) {
    Pending p;
    {
      MutexLock lock(&mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;
      p = std::move(it->second);
      pending_.erase(it);
    }
    s->item = p.item;
    s->intended_ns = p.intended_ns;
    s->completed_ns = NowNs();
    s->latency_us = (s->completed_ns - p.intended_ns) / 1e3;
    p.done(*s);
  }

  std::vector<std::unique_ptr<AttentionStream>> streams_;
  std::atomic<uint64_t> next_id_{0};
  Mutex mu_;
  std::unordered_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
};

// The sessions of rpc = kDecode: which are free, and the steps waiting for one.
class Driver::DecodePool {
 public:
  DecodePool(Client& client, const LoadOptions& options)
      : client_(client),
        timeout_(options.timeout),
        ids_(options.session_ids),
        lengths_(options.session_lengths) {
    lengths_.resize(ids_.size(), 0);
    for (size_t i = 0; i < ids_.size(); ++i) free_.push_back(i);
  }
  void Send(const Prepared& p, uint32_t item, int64_t intended_ns, Done done) {
    Step step{&p, item, intended_ns, std::move(done)};
    size_t session;
    {
      MutexLock lock(&mu_);
      if (free_.empty()) {
        waiting_.push_back(std::move(step));
        return;
      }
      session = free_.front();
      free_.pop_front();
    }
    Start(session, std::move(step));
  }

 private:
  struct Step {
    const Prepared* prepared;
    uint32_t item;
    int64_t intended_ns;
    Done done;
  };
  // Sends `step` on `session`, which is this step's alone until it completes.
  void Start(size_t session, Step step) {
    auto request = std::make_shared<v1::ExtendSessionRequest>(*step.prepared->extend);
    request->set_session_id(ids_[session]);
    request->set_expected_length(lengths_[session]);
    auto shared = std::make_shared<Step>(std::move(step));
    client_.ExtendSessionAsync(
        request,
        [this, session, shared](absl::StatusOr<v1::ExtendSessionResponse> r) {
          Sample s;
          s.intended_ns = shared->intended_ns;
          s.completed_ns = NowNs();
          s.latency_us = (s.completed_ns - shared->intended_ns) / 1e3;
          s.code = SampleCode(r.status());
          s.item = shared->item;
          if (r.ok()) {
            FillTiming(r->timing(), &s);
            lengths_[session] = r->length();
          }
          std::optional<Step> next;
          {
            MutexLock lock(&mu_);
            if (waiting_.empty()) {
              free_.push_back(session);
            } else {
              next = std::move(waiting_.front());
              waiting_.pop_front();
            }
          }
          // The next step first: `done` may end the phase, and the next step must count in
          // it before then (it was counted in flight when it was issued).
          if (next.has_value()) Start(session, std::move(*next));
          shared->done(s);
        },
        timeout_);
  }

  Client& client_;
  const absl::Duration timeout_;
  const std::vector<std::string> ids_;
  std::vector<int64_t> lengths_;  // [i] touched only by the step holding session i
  Mutex mu_;
  std::deque<size_t> free_ ABSL_GUARDED_BY(mu_);
  std::deque<Step> waiting_ ABSL_GUARDED_BY(mu_);
};

// The state of one phase, shared with the completion callbacks.
struct Driver::Phase {
  Recorder recorder;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> issued{0};
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> last_completion_ns{0};
  std::atomic<int64_t> first_send_ns{0};
  std::atomic<int64_t> last_send_ns{0};
  int64_t start_ns = 0;
  int64_t end_ns = 0;        // by duration; INT64_MAX when by count
  int64_t max_requests = 0;  // 0: by duration

  // Records a completion. The caller then calls Release() as its very last touch of the
  // phase: once in_flight reaches 0 the driver may destroy it.
  void Completed(const Sample& s) {
    recorder.Record(s);
    const int64_t now = NowNs();
    int64_t prev = last_completion_ns.load();
    while (prev < now && !last_completion_ns.compare_exchange_weak(prev, now)) {
    }
  }
  void Release() { in_flight.fetch_sub(1); }
  void Sent(int64_t t) {
    int64_t zero = 0;
    first_send_ns.compare_exchange_strong(zero, t);
    int64_t prev = last_send_ns.load();
    while (prev < t && !last_send_ns.compare_exchange_weak(prev, t)) {
    }
  }
};

Driver::Driver(Client& client, const Workload& workload, const LoadOptions& options)
    : client_(client), workload_(workload), options_(options) {
  if (options_.rpc == Rpc::kStream) {
    streams_ = std::make_unique<StreamPool>(client_, std::max(1, options_.streams));
  }
  if (options_.rpc == Rpc::kDecode) decode_ = std::make_unique<DecodePool>(client_, options_);
}

Driver::~Driver() = default;

void Driver::Issue(size_t item, int64_t intended_ns, Done done) {
  const Prepared& p = workload_.at(item);
  const uint32_t index = static_cast<uint32_t>(item);
  if (options_.rpc == Rpc::kStream) {
    streams_->Send(p, index, intended_ns, std::move(done));
    return;
  }
  if (options_.rpc == Rpc::kDecode) {
    decode_->Send(p, index, intended_ns, std::move(done));
    return;
  }
  auto finish = [intended_ns, index, done = std::move(done)](int code, const v1::Timing* t) {
    Sample s;
    s.intended_ns = intended_ns;
    s.completed_ns = NowNs();
    s.latency_us = (s.completed_ns - intended_ns) / 1e3;
    s.code = code;
    s.item = index;
    if (t != nullptr) FillTiming(*t, &s);
    done(s);
  };
  if (p.attend) {
    client_.AttendAsync(
        p.attend,
        [finish](absl::StatusOr<v1::AttendResponse> r) {
          finish(SampleCode(r.status()), r.ok() ? &r->timing() : nullptr);
        },
        options_.timeout);
  } else {
    client_.MultiHeadAttentionAsync(
        p.mha,
        [finish](absl::StatusOr<v1::MultiHeadAttentionResponse> r) {
          finish(SampleCode(r.status()), r.ok() ? &r->timing() : nullptr);
        },
        options_.timeout);
  }
}

namespace {

// The progress line: "\r" + one line, rewritten in place each second.
void PrintProgress(const std::string& name, double level, double t_s, const Recorder& rec,
                   int64_t issued, int64_t* last_count, double* last_t) {
  std::vector<Sample> samples = rec.Copy();
  std::vector<double> lat;
  int64_t errors = 0;
  for (const Sample& s : samples) {
    lat.push_back(s.latency_us / 1e3);
    errors += s.code != 0;
  }
  const Distribution d = Summarise(std::move(lat));
  const double rate =
      t_s > *last_t ? (static_cast<double>(samples.size()) - *last_count) / (t_s - *last_t) : 0;
  *last_count = static_cast<int64_t>(samples.size());
  *last_t = t_s;
  std::printf(
      "\r%-8s level %-8g %6.1fs  sent %-8lld done %-8zu err %-6lld %9.1f req/s  "
      "p50 %8.3f ms  p99 %8.3f ms   ",
      name.c_str(), level, t_s, static_cast<long long>(issued), samples.size(),
      static_cast<long long>(errors), rate, d.p50, d.p99);
  std::fflush(stdout);
}

}  // namespace

void Driver::RunClosed(Phase& phase, int callers) {
  // Each caller is a chain of calls: a completion records its sample and starts the next.
  auto next = std::make_shared<std::function<void()>>();
  *next = [this, &phase, next_weak = std::weak_ptr<std::function<void()>>(next)]() {
    if (phase.stop.load()) return;
    const int64_t n = phase.issued.fetch_add(1);
    if (phase.max_requests > 0 && n >= phase.max_requests) return;
    phase.in_flight.fetch_add(1);
    const int64_t now = NowNs();
    phase.Sent(now);
    auto again = next_weak.lock();
    Issue(workload_.Draw(Rng(options_.seed)), now, [&phase, again](const Sample& s) {
      phase.Completed(s);
      if (again) (*again)();  // the next call counts in in_flight before this one leaves
      phase.Release();
    });
  };
  for (int i = 0; i < callers; ++i) (*next)();
  int64_t last_count = 0;
  double last_t = 0;
  int64_t tick = phase.start_ns + 1'000'000'000;
  while (true) {
    const int64_t now = NowNs();
    if (now >= phase.end_ns) break;
    if (phase.max_requests > 0 && phase.issued.load() >= phase.max_requests &&
        phase.in_flight.load() == 0) {
      break;
    }
    if (options_.progress && now >= tick) {
      tick += 1'000'000'000;
      PrintProgress(
          "", callers, (now - phase.start_ns) / 1e9, phase.recorder,
          std::min(phase.issued.load(), phase.max_requests > 0 ? phase.max_requests : INT64_MAX),
          &last_count, &last_t);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  phase.stop.store(true);
  while (phase.in_flight.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  // `next` dies here; completions still referring to it have all run (in_flight is 0).
}

void Driver::RunOpen(Phase& phase, double rate) {
  std::mt19937_64 rng(options_.seed + static_cast<uint64_t>(rate * 1000));
  std::exponential_distribution<double> gap(rate);
  double offset_s = 0;
  int64_t last_count = 0;
  double last_t = 0;
  int64_t tick = phase.start_ns + 1'000'000'000;
  for (int64_t k = 0;; ++k) {
    if (phase.max_requests > 0 && k >= phase.max_requests) break;
    const int64_t intended = phase.start_ns + static_cast<int64_t>(offset_s * 1e9);
    if (intended >= phase.end_ns) break;
    offset_s += options_.arrival == LoadOptions::Arrival::kPoisson ? gap(rng) : 1.0 / rate;
    SleepUntilNs(intended);
    while (phase.in_flight.load() >= options_.max_in_flight) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    const int64_t now = NowNs();
    if (options_.progress && now >= tick) {
      tick += 1'000'000'000;
      PrintProgress("", rate, (now - phase.start_ns) / 1e9, phase.recorder, k, &last_count,
                    &last_t);
    }
    phase.issued.fetch_add(1);
    phase.in_flight.fetch_add(1);
    phase.Sent(now);
    Issue(workload_.Draw(rng), intended, [&phase](const Sample& s) {
      phase.Completed(s);
      phase.Release();
    });
  }
  while (phase.in_flight.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

PhaseReport Driver::RunPhase(const std::string& name, double level, bool warmup) {
  Phase phase;
  phase.start_ns = NowNs();
  const absl::Duration length = warmup ? options_.warmup : options_.phase_duration;
  phase.max_requests = warmup ? 0 : options_.phase_requests;
  phase.end_ns =
      phase.max_requests > 0 ? INT64_MAX : phase.start_ns + absl::ToInt64Nanoseconds(length);
  if (options_.mode == LoadOptions::Mode::kClosed) {
    RunClosed(phase, std::max(1, static_cast<int>(level)));
  } else {
    RunOpen(phase, level);
  }
  if (options_.progress) std::printf("\r%*s\r", 150, "");
  std::vector<int64_t> tokens;
  std::vector<double> flops;
  for (size_t i = 0; i < workload_.size(); ++i) {
    tokens.push_back(workload_.at(i).tokens);
    flops.push_back(workload_.at(i).flops);
  }
  const int64_t end = std::max(phase.last_completion_ns.load(), phase.start_ns + 1);
  const std::vector<Sample> samples = phase.recorder.Take();
  const double window = (phase.last_send_ns.load() - phase.first_send_ns.load()) / 1e9;
  PhaseReport r = Summarise(samples, tokens, flops, (end - phase.start_ns) / 1e9, window);
  // Sends per second over the send window: n sends span n - 1 gaps.
  r.sent_per_s = window > 0 && r.sent > 1 ? (r.sent - 1) / window : 0;
  r.name = name;
  r.level = level;
  r.level_kind = options_.mode == LoadOptions::Mode::kClosed ? "concurrency" : "rate";
  if (!warmup) {
    if (run_start_ns_ == 0) run_start_ns_ = phase.start_ns;
    r.start_s = (phase.start_ns - run_start_ns_) / 1e9;
    r.series = Bucketize(samples, phase.start_ns, end);
    for (double& t : r.series.t_s) t += r.start_s;
  }
  return r;
}

std::vector<PhaseReport> Driver::Run() {
  std::vector<PhaseReport> out;
  run_start_ns_ = 0;
  if (options_.warmup > absl::ZeroDuration()) RunPhase("warmup", options_.levels[0], true);
  for (size_t i = 0; i < options_.levels.size(); ++i) {
    out.push_back(RunPhase(absl::StrFormat("step%d", i + 1), options_.levels[i], false));
  }
  return out;
}

}  // namespace attnserve::bench
