// Turns proto requests into Jobs, validating everything a caller controls, and Jobs back into
// proto responses. The only place AttentionParams / MultiHeadParams are filled for the server.
//
// Every error names the field and the value, e.g.
//   INVALID_ARGUMENT "key.shape[3] must equal query.shape[3] (64); was 32".
// Limit violations are RESOURCE_EXHAUSTED (see Limits).
#ifndef ATTNSERVE_SERVER_TRANSPORT_REQUEST_BUILDER_H_
#define ATTNSERVE_SERVER_TRANSPORT_REQUEST_BUILDER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"
#include "server/core/job.h"
#include "server/core/module_registry.h"
#include "server/transport/limits.h"

namespace attnserve::server {

// The job's inputs are views of `request`'s tensor bytes (in their wire dtype): the request must
// outlive the job (the service keeps it in Job::request).
absl::StatusOr<std::unique_ptr<Job>> BuildAttendJob(const v1::AttendRequest& request,
                                                    const Limits& limits);

absl::StatusOr<std::unique_ptr<Job>> BuildMultiHeadJob(const v1::MultiHeadAttentionRequest& request,
                                                       const ModuleRegistry& modules,
                                                       const Limits& limits);

void WriteTiming(const JobTiming& timing, absl::Time now, v1::Timing* out);

// Decode sessions. CreateSession's request as a SessionSpec (INVALID_ARGUMENT naming the field,
// NOT_FOUND for an unknown module).
absl::StatusOr<sessions::SessionSpec> BuildSessionSpec(const v1::CreateSessionRequest& request,
                                                       const ModuleRegistry& modules,
                                                       const Limits& limits);
// ExtendSession: a job of one item holding its session's lease, or the item's error (the
// session's own codes, sessions/session_manager.h, and INVALID_ARGUMENT naming the field).
// `tenant`: the caller's (auth.h); another tenant's session is NOT_FOUND.
absl::StatusOr<std::unique_ptr<Job>> BuildExtendJob(const v1::ExtendSessionRequest& request,
                                                    const std::string& tenant,
                                                    sessions::SessionManager& manager,
                                                    const Limits& limits);
// ExtendSessions: a job of one item per step, each with its lease or its own error
// (INVALID_ARGUMENT "steps[i]: ..."); INVALID_ARGUMENT for no steps.
absl::StatusOr<std::unique_ptr<Job>> BuildExtendsJob(const v1::ExtendSessionsRequest& request,
                                                     const std::string& tenant,
                                                     sessions::SessionManager& manager,
                                                     const Limits& limits);
// False for a session job none of whose items holds a lease (every step failed validation):
// it is answered at once, without queueing.
bool HasWork(const Job& job);
void WriteSessionInfo(const sessions::SessionState& state, v1::SessionInfo* info);
void WriteExtendResponse(const sessions::ExtendItem& item, const JobTiming& timing, absl::Time now,
                         v1::ExtendSessionResponse* response);

// Fills a response from a computed job: outputs (and weights, or per-item results) and timing.
template <typename Response>
void FillResponse(Job& job, absl::Time now, Response* response);
void FillResponse(Job& job, absl::Time now, v1::ExtendSessionResponse* response);
void FillResponse(Job& job, absl::Time now, v1::ExtendSessionsResponse* response);

// Writes a computed job's output, and its weights when they were asked for, into a response
// (AttendResponse or MultiHeadAttentionResponse).
template <typename Response>
void WriteOutputs(const Job& job, Response* response);
void WriteTensor(kernels::DType dtype, absl::Span<const float> values,
                 const std::vector<int64_t>& shape, v1::Tensor* out);

template <typename Response>
void WriteOutputs(const Job& job, Response* response) {
  WriteTensor(job.dtype, job.out, job.out_shape, response->mutable_output());
  if (!job.weights_shape.empty()) {
    WriteTensor(job.dtype, job.weights, job.weights_shape, response->mutable_weights());
  }
}

template <typename Response>
void FillResponse(Job& job, absl::Time now, Response* response) {
  WriteOutputs(job, response);
  WriteTiming(job.timing, now, response->mutable_timing());
}

// Frees a job's request and outputs (once they are written into a response), so that a response
// being encoded does not hold its data twice over.
void ReleaseBuffers(Job* job);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_TRANSPORT_REQUEST_BUILDER_H_
