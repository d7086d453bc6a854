// attnserve-health-probe: asks a gRPC server's standard health service
// (grpc.health.v1.Health/Check) and exits 0 when it answers SERVING. It is the container
// HEALTHCHECK of the attnserve images (grpc_health_probe is not packaged in Debian, and
// attnserve-cli is a client for the attention API, not for health).
//
//   attnserve-health-probe                       # 127.0.0.1:<port of $ATTNSERVE_LISTEN, or
//                                                #   50051>, overall server health
//   attnserve-health-probe --addr=10.0.0.7:50051 --service=attnserve.v1.AttentionService
//   attnserve-health-probe --tls --tls_ca_file=ca.pem --tls_server_name=attnserve.example
//
// Exit status (the same as grpc_health_probe's): 0 SERVING, 1 bad arguments, 2 no connection
// within the timeout, 3 the rpc failed, 4 the answer was not SERVING (NOT_SERVING while the
// server drains on SIGTERM, UNKNOWN or SERVICE_UNKNOWN).
//
// It needs only gRPC: the two health messages are so small that they are encoded and decoded
// by hand here (HealthCheckRequest{string service = 1}, HealthCheckResponse{enum status = 1}),
// and the call goes through the generic stub, so no generated code is involved.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <vector>

#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"

namespace {

struct Options {
  std::string addr;  // empty: DefaultAddress()
  std::string service;
  long timeout_ms = 2000;
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_server_name;
  bool verbose = false;
};

constexpr char kUsage[] =
    "usage: attnserve-health-probe [--addr=HOST:PORT] [--service=NAME] [--timeout_ms=N]\n"
    "                              [--tls] [--tls_ca_file=PEM] [--tls_server_name=NAME] [-v]\n"
    "Asks grpc.health.v1.Health/Check; exit 0 SERVING, 1 bad arguments, 2 no connection,\n"
    "3 rpc failed, 4 not SERVING.\n";

// The default --addr: the loopback address and the port of $ATTNSERVE_LISTEN (the server's
// --listen given as an environment variable, see deploy/docker/entrypoint.sh), else 50051.
// Inside a container the probe runs next to the server, so loopback always reaches it.
std::string DefaultAddress() {
  const char* listen = std::getenv("ATTNSERVE_LISTEN");
  std::string port = "50051";
  if (listen != nullptr) {
    const std::string l = listen;
    const size_t colon = l.rfind(':');
    if (colon != std::string::npos && colon + 1 < l.size()) port = l.substr(colon + 1);
  }
  return "127.0.0.1:" + port;
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Parses --name=value flags; returns false (after printing why) on anything unknown.
bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const std::string& name, std::string* out) {
      const std::string prefix = "--" + name + "=";
      if (!StartsWith(a, prefix)) return false;
      *out = a.substr(prefix.size());
      return true;
    };
    std::string v;
    if (value("addr", &o->addr) || value("service", &o->service) ||
        value("tls_ca_file", &o->tls_ca_file) || value("tls_server_name", &o->tls_server_name)) {
      continue;
    } else if (value("timeout_ms", &v)) {
      char* end = nullptr;
      o->timeout_ms = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || o->timeout_ms <= 0) {
        std::fprintf(stderr, "attnserve-health-probe: bad --timeout_ms=%s\n", v.c_str());
        return false;
      }
    } else if (a == "--tls") {
      o->tls = true;
    } else if (a == "-v" || a == "--verbose") {
      o->verbose = true;
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      std::fprintf(stderr, "attnserve-health-probe: unknown argument %s\n%s", a.c_str(), kUsage);
      return false;
    }
  }
  if (!o->tls_ca_file.empty() || !o->tls_server_name.empty()) o->tls = true;
  if (o->addr.empty()) o->addr = DefaultAddress();
  return true;
}

// protobuf wire format, the two fields we need.
std::string EncodeRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;         // proto3: the default value is not sent
  out.push_back(static_cast<char>(0x0A));  // field 1, length-delimited
  uint64_t n = service.size();
  while (n >= 0x80) {
    out.push_back(static_cast<char>((n & 0x7F) | 0x80));
    n >>= 7;
  }
  out.push_back(static_cast<char>(n));
  return out + service;
}

bool ReadVarint(const std::string& s, size_t* pos, uint64_t* out) {
  *out = 0;
  for (int shift = 0; shift < 64 && *pos < s.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(s[(*pos)++]);
    *out |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// Returns the status field (0 when absent: UNKNOWN), or -1 when the bytes do not parse.
int DecodeStatus(const std::string& s) {
  int status = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    uint64_t key = 0, v = 0;
    if (!ReadVarint(s, &pos, &key)) return -1;
    switch (key & 7) {
      case 0:  // varint
        if (!ReadVarint(s, &pos, &v)) return -1;
        if ((key >> 3) == 1) status = static_cast<int>(v);
        break;
      case 1:
        pos += 8;
        break;
      case 5:
        pos += 4;
        break;
      case 2:
        if (!ReadVarint(s, &pos, &v)) return -1;
        pos += v;
        break;
      default:
        return -1;
    }
  }
  return pos == s.size() ? status : -1;
}

const char* StatusName(int s) {
  switch (s) {
    case 0:
      return "UNKNOWN";
    case 1:
      return "SERVING";
    case 2:
      return "NOT_SERVING";
    case 3:
      return "SERVICE_UNKNOWN";
    default:
      return "INVALID";
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, &o)) return 1;

  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  if (o.tls) {
    grpc::SslCredentialsOptions ssl;
    if (!o.tls_ca_file.empty()) {
      std::ifstream f(o.tls_ca_file, std::ios::binary);
      if (!f) {
        std::fprintf(stderr, "attnserve-health-probe: cannot read %s\n", o.tls_ca_file.c_str());
        return 1;
      }
      std::stringstream pem;
      pem << f.rdbuf();
      ssl.pem_root_certs = pem.str();
    }
    credentials = grpc::SslCredentials(ssl);
    if (!o.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(o.tls_server_name);
    }
  }
  auto channel = grpc::CreateCustomChannel(o.addr, credentials, args);
  const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(o.timeout_ms);
  if (!channel->WaitForConnected(deadline)) {
    std::fprintf(stderr, "attnserve-health-probe: no connection to %s within %ld ms\n",
                 o.addr.c_str(), o.timeout_ms);
    return 2;
  }

  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(deadline);
  const std::string request_bytes = EncodeRequest(o.service);
  grpc::Slice slice(request_bytes.data(), request_bytes.size());
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  const grpc::Status status = done.get_future().get();
  if (!status.ok()) {
    std::fprintf(stderr, "attnserve-health-probe: Check failed: code %d: %s\n",
                 static_cast<int>(status.error_code()), status.error_message().c_str());
    return 3;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!response.Dump(&slices).ok()) {
    std::fprintf(stderr, "attnserve-health-probe: unreadable response\n");
    return 3;
  }
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  const int serving = DecodeStatus(bytes);
  if (serving < 0) {
    std::fprintf(stderr, "attnserve-health-probe: malformed HealthCheckResponse\n");
    return 3;
  }
  if (o.verbose || serving != 1) {
    std::fprintf(serving == 1 ? stdout : stderr, "status: %s\n", StatusName(serving));
  }
  return serving == 1 ? 0 : 4;
}
