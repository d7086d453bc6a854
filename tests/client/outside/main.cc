// Calls a live attnserve through the installed client: GetServerInfo, a float16 Attend checked
// against a float64 computation here, the stream, and the installed fp16 codec (float_codec.h,
// base/float16.h). Exit 0 on success.
#include <cmath>
#include <cstdio>
#include <vector>

#include "client/client.h"
#include "client/float_codec.h"
#include "client/stream.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: outside HOST:PORT\n");
    return 2;
  }
  auto client = attnserve::Client::Create(argv[1]);
  if (!client.ok()) return 1;
  auto info = (*client)->GetServerInfo();
  if (!info.ok()) {
    std::fprintf(stderr, "GetServerInfo: %s\n", info.status().ToString().c_str());
    return 1;
  }
  // One head, Lq = 2, Lk = 3, D = 2, float16.
  const std::vector<float> q = {1, 0, 0, 1}, k = {1, 0, 0, 1, 1, 1}, v = {1, 2, 3, 4, 5, 6};
  attnserve::v1::AttendRequest request;
  *request.mutable_query() = attnserve::MakeTensor(attnserve::v1::DTYPE_FLOAT16, {1, 1, 2, 2}, q);
  *request.mutable_key() = attnserve::MakeTensor(attnserve::v1::DTYPE_FLOAT16, {1, 1, 3, 2}, k);
  *request.mutable_value() = attnserve::MakeTensor(attnserve::v1::DTYPE_FLOAT16, {1, 1, 3, 2}, v);
  auto response = (*client)->AttendAsync(request).get();
  if (!response.ok()) {
    std::fprintf(stderr, "Attend: %s\n", response.status().ToString().c_str());
    return 1;
  }
  auto out = attnserve::TensorToFloats(response->output()).value();
  double max_err = 0;
  for (int i = 0; i < 2; ++i) {
    double s[3], sum = 0;
    for (int j = 0; j < 3; ++j) {
      s[j] = std::exp((q[2 * i] * k[2 * j] + q[2 * i + 1] * k[2 * j + 1]) / std::sqrt(2.0));
      sum += s[j];
    }
    for (int d = 0; d < 2; ++d) {
      double o = 0;
      for (int j = 0; j < 3; ++j) o += s[j] / sum * v[2 * j + d];
      max_err = std::fmax(max_err, std::fabs(o - out[2 * i + d]));
    }
  }
  auto stream = (*client)->OpenStream();
  for (uint64_t id = 1; id <= 3; ++id) stream->Send(id, request);
  stream->CloseSend();
  int answers = 0;
  attnserve::v1::AttentionStreamResponse r;
  while (stream->Read(&r)) answers += r.code() == 0;
  const absl::Status status = stream->Finish();
  std::printf("outside: server %s, max |error| %.3g, stream answers %d (%s)\n",
              info->version().c_str(), max_err, answers, status.ToString().c_str());
  // 0.1 in float16 is 0x2e66 = 1638 / 16384.
  const bool codec_ok = attnserve::codec::FloatToHalf(0.1f) == 0x2e66 &&
                        attnserve::codec::HalfToFloat(0x2e66) == 1638.0f / 16384.0f;
  if (!codec_ok) std::fprintf(stderr, "the installed float16 codec is wrong\n");
  return codec_ok && max_err < 1e-2 && answers == 3 && status.ok() ? 0 : 1;
}
