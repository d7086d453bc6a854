// attnserve-bench: a load generator for attnserve (and anything that speaks its proto).
//
//   attnserve-bench --target=127.0.0.1:50051 --rpc=attend --shapes=1,8,128,64
//       --mode=closed --concurrency=8 --duration_s=10
//   attnserve-bench --mode=open --rate=200 --arrival=poisson --rpc=mha --shapes="1,64;4,256@0.2"
//   attnserve-bench --mode=open --ramp=50:400:8 --duration_s=5 --csv=knee.csv   # find the knee
//   attnserve-bench --mode=closed --steps=1,2,4,8,16 --json=-                   # JSON on stdout
//   attnserve-bench --mode=open --ramp=50:400:8 --json=run.json --html=run.html  # with charts
//   attnserve-bench --html_from=run.json --html=run.html                 # redraw a saved run
//   attnserve-bench --sweep_from=sweep.json --html=sweep.html   # a request-size sweep's page
//   attnserve-bench --rpc=decode --sessions=16 --prefill=4096 --decode_steps=64
//       --shapes=1,32,1,128 --kv_heads=8            # decode: 16 sessions x 64 steps each
//
// Prints one line per phase (see --help for every flag); a live progress line only when stdout
// is a terminal. Exit status: 0 when every request succeeded, 1 when some failed, 2 on bad
// flags or an unreachable server.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "base/flags_usage.h"
#include "client/bench/load.h"
#include "client/bench/report.h"
#include "client/bench/stats.h"
#include "client/bench/workload.h"
#include "client/client.h"
#include "client/session.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, target, "localhost:50051",
          "gRPC target; several servers: ipv4:127.0.0.1:p1,127.0.0.1:p2 (round_robin)");
ABSL_FLAG(int, connections, 1, "channels (TCP connections) calls are spread over");
ABSL_FLAG(std::string, rpc, "attend",
          "attend, mha, stream, or decode (steps of prefilled sessions; see --sessions)");
ABSL_FLAG(int, sessions, 8,
          "decode: sessions created and prefilled before the run (spread over the servers of an "
          "ipv4:/ipv6: target, each stepped on its own)");
ABSL_FLAG(int64_t, prefill, 1024, "decode: tokens each session is prefilled with");
ABSL_FLAG(int64_t, decode_steps, 0,
          "decode: steps per session per phase (sets --requests to sessions x steps)");
ABSL_FLAG(std::string, stream_payload, "attend", "rpc=stream: attend or mha requests");
ABSL_FLAG(std::string, mode, "closed", "closed (N concurrent callers) or open (arrival rate)");
ABSL_FLAG(int, concurrency, 1, "closed loop: concurrent callers");
ABSL_FLAG(double, rate, 100, "open loop: requests per second");
ABSL_FLAG(std::string, arrival, "constant", "open loop: constant or poisson");
ABSL_FLAG(std::string, steps, "",
          "schedule: comma-separated levels (concurrency or rate), one phase each");
ABSL_FLAG(std::string, ramp, "",
          "schedule: FROM:TO:STEPS, a ramp of levels cut into STEPS equal phases");
ABSL_FLAG(double, duration_s, 10, "seconds per phase (unless --requests)");
ABSL_FLAG(int64_t, requests, 0, "requests per phase; 0: by --duration_s");
ABSL_FLAG(double, warmup_s, 1, "warm-up seconds at the first level, not reported");
ABSL_FLAG(std::string, shapes, "",
          "attend: B,H,L,D[@W];... (default 1,8,128,64); mha: B,L[@W];... (default 1,128)");
ABSL_FLAG(std::string, seq_len, "",
          "sequence lengths: fixed (default), uniform:MIN:MAX, lognormal:MEDIAN:SIGMA:MAX, "
          "choice:L1,L2,...");
ABSL_FLAG(int, pool, 32, "prepared requests drawn from a --seq_len distribution");
ABSL_FLAG(int, kv_heads, 0, "attend: key/value heads (default H)");
ABSL_FLAG(std::string, dtype, "float32", "float32, float16 or bfloat16");
ABSL_FLAG(bool, causal, false, "causal masking");
ABSL_FLAG(std::string, kind, "softmax",
          "softmax or linear (attention.proto, AttentionOptions.kind)");
ABSL_FLAG(std::string, feature_map, "elu_plus_one",
          "linear attention's feature map: elu_plus_one, relu or identity (with --kind=linear)");
ABSL_FLAG(std::string, window, "",
          "sliding window as LEFT,RIGHT (-1: that side open; decode sessions: RIGHT 0 or -1); "
          "empty: none");
ABSL_FLAG(double, softcap, 0, "logit soft-cap (0: none)");
ABSL_FLAG(bool, alibi, false, "ALiBi with the standard slopes");
ABSL_FLAG(std::string, module, "demo", "mha: module name");
ABSL_FLAG(int64_t, timeout_ms, 60000, "deadline of each unary call");
ABSL_FLAG(int64_t, max_in_flight, 100000, "open loop: most requests outstanding");
ABSL_FLAG(uint64_t, seed, 1, "random seed (tensors, shape draws, Poisson gaps)");
ABSL_FLAG(std::string, json, "", "write the report as JSON to this file ('-': stdout)");
ABSL_FLAG(std::string, csv, "", "write the report as CSV to this file ('-': stdout)");
ABSL_FLAG(std::string, html, "",
          "write a self-contained HTML report with charts to this file (drawn from the JSON)");
ABSL_FLAG(std::string, html_from, "",
          "redraw a saved JSON report (from --json) as --html, without running anything");
ABSL_FLAG(std::string, sweep_from, "",
          "draw a request-size sweep (JSON from tests/bench/serving_sweep.py: each server's CPU "
          "per call beside the backend's and the echo server's, across request sizes) as the "
          "--html page, without running anything (a bad file: exit 2 naming the field)");
ABSL_FLAG(std::string, progress, "auto",
          "live progress line: auto (when stdout is a tty), on, off");
ABSL_FLAG(std::string, tls_ca_file, "", "PEM CA of the server's certificate (turns TLS on)");
ABSL_FLAG(std::string, auth_token_file, "", "file holding a bearer token");
ABSL_FLAG(bool, retries, false, "let gRPC retry UNAVAILABLE (off: errors are counted as such)");
ABSL_FLAG(bool, throttle, false,
          "client-side adaptive throttling as the client libraries do by default (k 2, 30 s "
          "window, p at most 0.95, client/throttle.h); off: every call reaches the server, whose "
          "own refusals are measured. Rejections count as THROTTLED_BY_CLIENT (drawn from the "
          "throttle's odds) or HELD_BY_PUSHBACK (while a server's retry pushback lasts)");

namespace {

namespace v1 = attnserve::v1;
namespace bench = attnserve::bench;

int Usage(const std::string& message) {
  std::fprintf(stderr, "attnserve-bench: %s\n", message.c_str());
  return 2;
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

bool WriteOutput(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fputs(text.c_str(), stdout);
    return true;
  }
  std::ofstream f(path);
  f << text;
  return static_cast<bool>(f);
}

// --html_from and --sweep_from: the JSON saved at `from` (by --json or the sweep), parsed by
// `parse` and drawn by `draw` as HTML into `to`.
template <typename Parse, typename Draw>
int DrawFrom(const char* flag, const std::string& from, const std::string& to, Parse parse,
             Draw draw) {
  if (to.empty()) return Usage(absl::StrCat("--", flag, " needs --html=FILE to write to"));
  std::string text;
  if (!ReadFile(from, &text)) return Usage(absl::StrCat("cannot read --", flag, " ", from));
  auto parsed = parse(text);
  if (!parsed.ok()) return Usage(from + ": " + std::string(parsed.status().message()));
  if (!WriteOutput(to, draw(*parsed))) return Usage("cannot write " + to);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  attnserve::ShowFlagsOfFileInHelp(__FILE__);  // --help lists the flags above
  absl::SetProgramUsageMessage(
      "attnserve-bench [--target=HOST:PORT] [--rpc=attend|mha|stream] [--mode=closed|open] ...");
  absl::ParseCommandLine(argc, argv);
  // The load generator's CPU should go to the calls, not to its own overheads (it usually shares
  // the machine with what it measures): Debian's Abseil checks every absl::Mutex lock (gRPC's)
  // for deadlock cycles unless told not to, as attnserve's main says; and glibc gives every
  // buffer of 128 KiB or more (a request's or a response's bytes) fresh pages, which the kernel
  // zeroes and faults in, and unmaps them when it is freed: per call, with large tensors. Here
  // they stay in the heap and are reused (the process keeps its peak).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);

  // --- Flags to options ---
  bench::LoadOptions load;
  bench::WorkloadOptions work;
  if (const std::string from = absl::GetFlag(FLAGS_sweep_from); !from.empty()) {
    if (!absl::GetFlag(FLAGS_html_from).empty()) {
      return Usage("give --sweep_from or --html_from, not both");
    }
    return DrawFrom("sweep_from", from, absl::GetFlag(FLAGS_html), bench::ParseSweep,
                    bench::SweepToHtml);  // nothing to run
  }
  if (const std::string from = absl::GetFlag(FLAGS_html_from); !from.empty()) {
    return DrawFrom("html_from", from, absl::GetFlag(FLAGS_html), bench::ParseJsonReport,
                    bench::ToHtml);  // nothing to run
  }
  const std::string rpc = absl::GetFlag(FLAGS_rpc);
  if (rpc == "attend") {
    load.rpc = bench::Rpc::kAttend;
  } else if (rpc == "mha") {
    load.rpc = bench::Rpc::kMultiHead;
    work.multi_head = true;
  } else if (rpc == "stream") {
    load.rpc = bench::Rpc::kStream;
    const std::string payload = absl::GetFlag(FLAGS_stream_payload);
    if (payload != "attend" && payload != "mha") {
      return Usage("--stream_payload must be attend or mha; was '" + payload + "'");
    }
    work.multi_head = payload == "mha";
  } else if (rpc == "decode") {
    load.rpc = bench::Rpc::kDecode;
    work.decode = true;
  } else {
    return Usage("--rpc must be attend, mha, stream or decode; was '" + rpc + "'");
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "closed" && mode != "open") {
    return Usage("--mode must be closed or open; was '" + mode + "'");
  }
  load.mode = mode == "open" ? bench::LoadOptions::Mode::kOpen : bench::LoadOptions::Mode::kClosed;
  const std::string arrival = absl::GetFlag(FLAGS_arrival);
  if (arrival != "constant" && arrival != "poisson") {
    return Usage("--arrival must be constant or poisson; was '" + arrival + "'");
  }
  load.arrival = arrival == "poisson" ? bench::LoadOptions::Arrival::kPoisson
                                      : bench::LoadOptions::Arrival::kConstant;
  if (!absl::GetFlag(FLAGS_steps).empty() && !absl::GetFlag(FLAGS_ramp).empty()) {
    return Usage("give --steps or --ramp, not both");
  }
  if (!absl::GetFlag(FLAGS_steps).empty()) {
    load.levels.clear();
    for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_steps), ',')) {
      double v;
      if (!absl::SimpleAtod(s, &v) || v <= 0)
        return Usage("--steps: bad level '" + std::string(s) + "'");
      load.levels.push_back(v);
    }
  } else if (!absl::GetFlag(FLAGS_ramp).empty()) {
    std::vector<std::string> p = absl::StrSplit(absl::GetFlag(FLAGS_ramp), ':');
    double from, to;
    int n;
    if (p.size() != 3 || !absl::SimpleAtod(p[0], &from) || !absl::SimpleAtod(p[1], &to) ||
        !absl::SimpleAtoi(p[2], &n) || from <= 0 || to <= 0 || n < 1) {
      return Usage("--ramp must be FROM:TO:STEPS with positive numbers; was '" +
                   absl::GetFlag(FLAGS_ramp) + "'");
    }
    load.levels = bench::RampLevels(from, to, n);
  } else {
    load.levels = {load.mode == bench::LoadOptions::Mode::kOpen
                       ? absl::GetFlag(FLAGS_rate)
                       : static_cast<double>(absl::GetFlag(FLAGS_concurrency))};
  }
  for (double l : load.levels) {
    if (!(l > 0)) return Usage(absl::StrCat("levels must be positive; got ", l));
  }
  if (absl::GetFlag(FLAGS_duration_s) <= 0 && absl::GetFlag(FLAGS_requests) <= 0) {
    return Usage("--duration_s or --requests must be positive");
  }
  load.phase_duration = absl::Seconds(absl::GetFlag(FLAGS_duration_s));
  load.phase_requests = absl::GetFlag(FLAGS_requests);
  const int sessions = absl::GetFlag(FLAGS_sessions);
  const int64_t prefill = absl::GetFlag(FLAGS_prefill);
  if (work.decode) {
    if (sessions < 1) return Usage(absl::StrCat("--sessions must be positive; was ", sessions));
    if (prefill < 1) return Usage(absl::StrCat("--prefill must be positive; was ", prefill));
    if (absl::GetFlag(FLAGS_decode_steps) > 0 && load.phase_requests == 0) {
      load.phase_requests = sessions * absl::GetFlag(FLAGS_decode_steps);
    }
    work.decode_context = prefill;
  }
  load.warmup = absl::Seconds(std::max(0.0, absl::GetFlag(FLAGS_warmup_s)));
  load.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  load.streams = std::max(1, absl::GetFlag(FLAGS_connections));
  load.max_in_flight = std::max<int64_t>(1, absl::GetFlag(FLAGS_max_in_flight));
  load.seed = absl::GetFlag(FLAGS_seed);
  const std::string progress = absl::GetFlag(FLAGS_progress);
  load.progress = progress == "on" || (progress == "auto" && isatty(STDOUT_FILENO));

  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "float32") {
    work.dtype = v1::DTYPE_FLOAT32;
  } else if (dtype == "float16") {
    work.dtype = v1::DTYPE_FLOAT16;
  } else if (dtype == "bfloat16") {
    work.dtype = v1::DTYPE_BFLOAT16;
  } else {
    return Usage("--dtype must be float32, float16 or bfloat16; was '" + dtype + "'");
  }
  std::string shapes = absl::GetFlag(FLAGS_shapes);
  if (shapes.empty()) {
    shapes = work.multi_head ? "1,128" : work.decode ? "1,8,1,64" : "1,8,128,64";
  }
  auto parsed = bench::ParseShapes(shapes, work.multi_head ? 2 : 4);
  if (!parsed.ok()) return Usage(std::string(parsed.status().message()));
  if (work.decode && parsed->size() != 1) {
    return Usage("decode: --shapes must be one 1,H,1,D (the sessions' heads); was '" + shapes +
                 "'");
  }
  work.shapes = *parsed;
  auto seq = bench::ParseSeqLen(absl::GetFlag(FLAGS_seq_len));
  if (!seq.ok()) return Usage(std::string(seq.status().message()));
  work.seq_len = *seq;
  work.pool_size = absl::GetFlag(FLAGS_pool);
  work.kv_heads = absl::GetFlag(FLAGS_kv_heads);
  work.causal = absl::GetFlag(FLAGS_causal);
  const std::string kind = absl::GetFlag(FLAGS_kind);
  if (kind != "softmax" && kind != "linear") {
    return Usage("--kind must be softmax or linear; was " + kind);
  }
  work.kind = kind == "linear" ? attnserve::v1::ATTENTION_KIND_LINEAR
                               : attnserve::v1::ATTENTION_KIND_UNSPECIFIED;
  const std::string feature_map = absl::GetFlag(FLAGS_feature_map);
  const std::optional<attnserve::v1::FeatureMap> named = attnserve::FeatureMapNamed(feature_map);
  if (!named.has_value()) {
    return Usage("--feature_map must be elu_plus_one, relu or identity; was " + feature_map);
  }
  if (kind != "linear" && feature_map != "elu_plus_one") {
    return Usage("--feature_map is for --kind=linear");
  }
  if (kind == "linear") work.feature_map = *named;
  const std::string window = absl::GetFlag(FLAGS_window);
  if (!window.empty()) {
    const std::vector<std::string> sides = absl::StrSplit(window, ',');
    if (sides.size() != 2 || !absl::SimpleAtoi(sides[0], &work.window_left) ||
        !absl::SimpleAtoi(sides[1], &work.window_right)) {
      return Usage("--window must be LEFT,RIGHT (integers, -1: open); was " + window);
    }
  }
  work.softcap = static_cast<float>(absl::GetFlag(FLAGS_softcap));
  work.alibi = absl::GetFlag(FLAGS_alibi);
  work.module = absl::GetFlag(FLAGS_module);
  work.seed = load.seed;

  // --- Client ---
  attnserve::ClientOptions copts;
  copts.channels = std::max(1, absl::GetFlag(FLAGS_connections));
  copts.timeout = load.timeout;
  if (absl::GetFlag(FLAGS_retries)) copts.retry.max_attempts = 4;
  copts.throttle.enabled = absl::GetFlag(FLAGS_throttle);
  if (absl::StartsWith(absl::GetFlag(FLAGS_target), "ipv4:") ||
      absl::StartsWith(absl::GetFlag(FLAGS_target), "ipv6:") ||
      absl::StartsWith(absl::GetFlag(FLAGS_target), "dns:")) {
    copts.load_balancing = "round_robin";
  }
  if (const std::string ca = absl::GetFlag(FLAGS_tls_ca_file); !ca.empty()) {
    copts.tls = true;
    if (!ReadFile(ca, &copts.tls_root_certs)) return Usage("cannot read --tls_ca_file " + ca);
  }
  if (const std::string tf = absl::GetFlag(FLAGS_auth_token_file); !tf.empty()) {
    std::string token;
    if (!ReadFile(tf, &token)) return Usage("cannot read --auth_token_file " + tf);
    copts.auth_token = std::string(absl::StripAsciiWhitespace(token));
  }
  // Decode against several servers ("ipv4:a:p1,b:p2"): a client that knows each address, so
  // that every session's steps reach the server holding it (client/client.h).
  const std::string target = absl::GetFlag(FLAGS_target);
  const bool replicas =
      work.decode && (absl::StartsWith(target, "ipv4:") || absl::StartsWith(target, "ipv6:"));
  auto client =
      replicas ? attnserve::Client::CreateBalanced(absl::StrSplit(target.substr(5), ','), copts)
               : attnserve::Client::Create(target, copts);
  if (!client.ok()) return Usage(client.status().ToString());
  auto info = (*client)->GetServerInfo(absl::Seconds(20));
  if (!info.ok()) return Usage("GetServerInfo: " + info.status().ToString());
  std::string backend = "?";
  for (const auto& b : info->backends()) {
    if (b.active()) backend = b.name();
  }
  if (work.multi_head) {
    auto modules = (*client)->ListModules(absl::Seconds(20));
    if (!modules.ok()) return Usage("ListModules: " + modules.status().ToString());
    for (const auto& m : modules->modules()) {
      if (m.name() == work.module) work.d_model = m.d_model();
    }
    if (work.d_model == 0) return Usage("no module '" + work.module + "' on the server");
  }
  auto workload = bench::Workload::Create(work);
  if (!workload.ok()) return Usage(workload.status().ToString());
  // Decode: the sessions, prefilled; closed when `open_sessions` goes, after the run.
  std::vector<attnserve::Session> open_sessions;
  if (work.decode) {
    const bench::ShapeSpec& s = work.shapes[0];
    attnserve::HeadLayout layout;
    layout.num_heads = static_cast<int>(s.heads);
    layout.num_kv_heads = static_cast<int>(work.kv_heads > 0 ? work.kv_heads : s.heads);
    layout.head_dim = static_cast<int>(s.head_dim);
    attnserve::SessionOptions sopts;
    sopts.cache_dtype = work.dtype;
    sopts.timeout = load.timeout;
    // --window, --softcap, --alibi: the sessions' score modifications (a session is causal:
    // the window's left side is what counts).
    sopts.window_left = work.window_left;
    sopts.softcap = work.softcap;
    sopts.alibi_standard = work.alibi;
    sopts.kind = work.kind;  // --kind=linear: linear-attention sessions
    sopts.feature_map = work.feature_map;
    std::mt19937 rng(static_cast<uint32_t>(load.seed));
    std::normal_distribution<float> normal;
    auto random = [&](std::vector<int64_t> shape) {
      std::vector<float> v(shape[0] * shape[1] * shape[2]);
      for (float& x : v) x = normal(rng);
      return attnserve::MakeTensor(work.dtype, shape, v);
    };
    // Prefilled in extends of at most kChunk tokens (the same random tokens again in each), so
    // that long contexts stay within the request limits.
    constexpr int64_t kChunk = 8192;
    const int64_t chunk = std::min(prefill, kChunk);
    const v1::Tensor q = random({chunk, layout.num_heads, layout.head_dim});
    const v1::Tensor k = random({chunk, layout.num_kv_heads, layout.head_dim});
    const v1::Tensor v = random({chunk, layout.num_kv_heads, layout.head_dim});
    const auto first_rows = [](const v1::Tensor& t, int64_t rows) {
      v1::Tensor out = t;
      out.set_shape(0, rows);
      out.mutable_data()->resize(t.data().size() / t.shape(0) * rows);
      return out;
    };
    for (int i = 0; i < sessions; ++i) {
      auto session = attnserve::Session::CreateRaw(client->get(), layout, sopts);
      if (!session.ok()) return Usage("CreateSession: " + session.status().ToString());
      for (int64_t from = 0; from < prefill; from += chunk) {
        const int64_t rows = std::min(chunk, prefill - from);
        auto r = rows == chunk ? session->Extend(q, k, v)
                               : session->Extend(first_rows(q, rows), first_rows(k, rows),
                                                 first_rows(v, rows));
        if (!r.ok()) return Usage("prefill: " + r.status().ToString());
      }
      load.session_ids.push_back(session->id());
      load.session_lengths.push_back(session->length());
      open_sessions.push_back(*std::move(session));
    }
  }

  std::vector<double> levels;  // as the table prints them: 6 significant digits
  for (double l : load.levels) levels.push_back(std::stod(absl::StrFormat("%.6g", l)));
  bench::RunReport report;
  report.config = {{"target", absl::GetFlag(FLAGS_target)},
                   {"rpc", rpc},
                   {"mode", mode},
                   {"arrival", arrival},
                   {"levels", levels},
                   {"connections", copts.channels},
                   {"shapes", shapes},
                   {"seq_len", absl::GetFlag(FLAGS_seq_len)},
                   {"dtype", dtype},
                   {"causal", work.causal},
                   {"kind", kind},
                   {"feature_map", kind == "linear" ? feature_map : ""},
                   {"window", window},
                   {"softcap", work.softcap},
                   {"alibi", work.alibi},
                   {"phase_duration_s", absl::GetFlag(FLAGS_duration_s)},
                   {"phase_requests", load.phase_requests},
                   {"warmup_s", absl::GetFlag(FLAGS_warmup_s)},
                   {"timeout_ms", absl::GetFlag(FLAGS_timeout_ms)},
                   {"seed", load.seed},
                   {"started_utc", bench::UtcTimestamp()},
                   {"server_version", info->version()},
                   {"server_backend", backend},
                   {"mean_request_bytes", std::round(workload->mean_bytes())},
                   {"mean_tokens", workload->mean_tokens()},
                   {"mean_flops", workload->mean_flops()}};
  if (work.multi_head) report.config["module"] = work.module;
  if (work.decode) {
    report.config["sessions"] = sessions;
    report.config["prefill"] = prefill;
    report.config["decode_steps"] = absl::GetFlag(FLAGS_decode_steps);
    report.config["kv_heads"] = work.kv_heads;
  }
  {
    google::protobuf::util::JsonPrintOptions o;
    o.preserve_proto_field_names = true;
    o.always_print_primitive_fields = true;
    std::string text;
    if (google::protobuf::util::MessageToJsonString(*info, &text, o).ok()) {
      report.server = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (report.server.is_discarded()) report.server = nlohmann::ordered_json::object();
    }
  }
  report.machine = bench::DescribeMachine();

  const bool quiet = absl::GetFlag(FLAGS_json) == "-" || absl::GetFlag(FLAGS_csv) == "-" ||
                     absl::GetFlag(FLAGS_html) == "-";
  if (!quiet) {
    std::printf("attnserve-bench: %s %s loop, %s, %zu phase(s) against %s (attnserve %s, %s)\n",
                rpc.c_str(), mode.c_str(), shapes.c_str(), load.levels.size(),
                absl::GetFlag(FLAGS_target).c_str(), info->version().c_str(), backend.c_str());
    std::fflush(stdout);
  }
  {
    bench::Driver driver(**client, *workload, load);
    report.phases = driver.Run();
  }
  const std::vector<bench::PhaseReport>& phases = report.phases;
  if (!quiet) std::printf("%s", bench::ToText(phases).c_str());
  if (const std::string j = absl::GetFlag(FLAGS_json); !j.empty()) {
    if (!WriteOutput(j, bench::ToJson(report))) return Usage("cannot write " + j);
  }
  if (const std::string h = absl::GetFlag(FLAGS_html); !h.empty()) {
    // Drawn from the JSON text, exactly as --html_from redraws a saved run.
    auto saved = bench::ParseJsonReport(bench::ToJson(report));
    if (!saved.ok()) return Usage("report: " + saved.status().ToString());
    if (!WriteOutput(h, bench::ToHtml(*saved))) return Usage("cannot write " + h);
  }
  if (const std::string c = absl::GetFlag(FLAGS_csv); !c.empty()) {
    if (!WriteOutput(c, bench::ToCsv(phases))) return Usage("cannot write " + c);
  }
  for (const auto& p : phases) {
    if (p.ok != p.sent) return 1;
  }
  return 0;
}
