// The one mapping between absl::Status and grpc::Status. Both use the canonical codes, so the
// mapping is 1:1 and messages pass through unchanged.
#ifndef KNNSERVE_COMMON_GRPC_STATUS_H_
#define KNNSERVE_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace knnserve {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_GRPC_STATUS_H_
