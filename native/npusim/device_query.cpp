// Device queries the kernel samples' host code makes: device status, utilization, the stream
// priority range. A software device is never in an abnormal state while its daemon answers, and it
// has no cube/vector/AI CPU counters: those rates read 0, memory's is what the device has in use.
#include "acl/acl_rt.h"
#include "runtime.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

constexpr int32_t kLeastPriority = 7;  // aclrtCreateStreamWithConfig takes 0 (highest) .. 7
constexpr int32_t kGreatestPriority = 0;

}  // namespace

extern "C" {

aclError aclrtQueryDeviceStatus(int32_t deviceId, aclrtDeviceStatus *deviceStatus) {
  if (deviceStatus == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtQueryDeviceStatus: deviceStatus is NULL");
  CallScope scope;
  if (aclError rc = device_known(deviceId, "aclrtQueryDeviceStatus"); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::MemInfo);  // the daemon answers for the device
  rq.device = deviceId;
  proto::Reply rp{};
  *deviceStatus = runtime().pool.call(rq, &rp) == ACL_SUCCESS ? ACL_RT_DEVICE_STATUS_NORMAL : ACL_RT_DEVICE_STATUS_ABNORMAL;
  return ACL_SUCCESS;
}

aclError aclrtGetDeviceUtilizationRate(int32_t deviceId, aclrtUtilizationInfo *utilizationInfo) {
  if (utilizationInfo == nullptr || utilizationInfo->utilizationExtend != nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM,
                      "aclrtGetDeviceUtilizationRate: utilizationInfo is NULL or its utilizationExtend is set");
  CallScope scope;
  if (aclError rc = device_known(deviceId, "aclrtGetDeviceUtilizationRate"); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::MemInfo);
  rq.device = deviceId;
  proto::Reply rp{};
  if (int32_t rc = runtime().pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  const uint64_t free = rp.value[0], total = rp.value[1];
  utilizationInfo->cubeUtilization = 0;
  utilizationInfo->vectorUtilization = 0;
  utilizationInfo->aicpuUtilization = 0;
  utilizationInfo->memoryUtilization = total > 0 ? static_cast<int32_t>((total - free) * 100 / total) : 0;
  return ACL_SUCCESS;
}

aclError aclrtDeviceGetStreamPriorityRange(int32_t *leastPriority, int32_t *greatestPriority) {
  if (leastPriority == nullptr || greatestPriority == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtDeviceGetStreamPriorityRange: NULL argument");
  *leastPriority = kLeastPriority;
  *greatestPriority = kGreatestPriority;
  return ACL_SUCCESS;
}

}  // extern "C"
