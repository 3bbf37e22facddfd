// Per-thread error reporting: the message and code of the calling thread's last failed call
// (aclGetRecentErrMsg, aclrtGetLastError / PeekAtLastError), the snapshot's refusals included, and
// the exception callback that a failed device task reports to.
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "runtime.h"

using namespace npusim::rt;

// CANN keeps the struct opaque; these are the fields its getters read.
struct rtExceptionInfo {
  uint32_t taskid;
  uint32_t streamid;
  uint32_t tid;
  uint32_t deviceid;
  uint32_t retcode;
  void *function;    // a failed kernel launch's function handle, else null
  const void *args;  // its argument bytes (a copy), else null
  uint32_t args_len;
};

namespace {
thread_local std::string t_message;   // the last failure's message, until read
thread_local std::string t_returned;  // what aclGetRecentErrMsg handed out last
thread_local aclError t_code = ACL_SUCCESS;
std::atomic<aclrtExceptionInfoCallback> g_exception_callback{nullptr};
}  // namespace

namespace npusim::rt {

void note_error(const std::string &message) { t_message = message; }

aclError note_error(aclError code, const std::string &message) {
  t_message = message;
  t_code = code;
  return code;
}

const std::string &recent_error() { return t_message; }

void report_task_exception(StreamObj *stream, uint64_t task, aclError code) {
  aclrtExceptionInfoCallback cb = g_exception_callback.load();
  if (cb == nullptr) return;
  // The launch's arguments outlive the callback: a program may keep the pointer it was handed.
  static thread_local FailedLaunch t_launch;
  t_launch = FailedLaunch{};
  const bool launch = find_launch(stream, task, &t_launch);
  rtExceptionInfo info{static_cast<uint32_t>(task), static_cast<uint32_t>(stream->public_id),
                       static_cast<uint32_t>(::syscall(SYS_gettid)), static_cast<uint32_t>(stream->device),
                       static_cast<uint32_t>(code), launch ? t_launch.function : nullptr,
                       launch ? t_launch.args.data() : nullptr, static_cast<uint32_t>(t_launch.args.size())};
  cb(&info);
}

}  // namespace npusim::rt

extern "C" {

const char *aclGetRecentErrMsg() {
  if (t_message.empty()) return nullptr;
  t_returned = std::move(t_message);  // read once: the next call reports only a newer failure
  t_message.clear();
  return t_returned.c_str();
}

aclError aclrtPeekAtLastError(aclrtLastErrLevel level) {
  if (level != ACL_RT_THREAD_LEVEL) return ACL_ERROR_INVALID_PARAM;
  return t_code;
}

aclError aclrtGetLastError(aclrtLastErrLevel level) {
  if (level != ACL_RT_THREAD_LEVEL) return ACL_ERROR_INVALID_PARAM;
  aclError code = t_code;
  t_code = ACL_SUCCESS;
  return code;
}

aclError aclrtGetErrorVerbose(int32_t deviceId, aclrtErrorInfo *errorInfo) {
  if (errorInfo == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetErrorVerbose: errorInfo is NULL");
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return note_error(ACL_ERROR_UNINITIALIZE, "aclrtGetErrorVerbose: aclInit was not called");
  if (deviceId < 0 || static_cast<uint32_t>(deviceId) >= r.pool.device_count)
    return note_error(ACL_ERROR_RT_INVALID_DEVICEID, "aclrtGetErrorVerbose: no device " + std::to_string(deviceId));
  // A simulated device has no hardware faults (memory UCE, AI Core, link) to describe.
  std::memset(errorInfo, 0, sizeof(*errorInfo));
  errorInfo->errorType = ACL_RT_NO_ERROR;
  return ACL_SUCCESS;
}

aclError aclrtSetExceptionInfoCallback(aclrtExceptionInfoCallback callback) {
  g_exception_callback = callback;
  return ACL_SUCCESS;
}

uint32_t aclrtGetTaskIdFromExceptionInfo(const aclrtExceptionInfo *info) { return info ? info->taskid : 0xFFFFFFFFU; }
uint32_t aclrtGetStreamIdFromExceptionInfo(const aclrtExceptionInfo *info) { return info ? info->streamid : 0xFFFFFFFFU; }
uint32_t aclrtGetThreadIdFromExceptionInfo(const aclrtExceptionInfo *info) { return info ? info->tid : 0xFFFFFFFFU; }
uint32_t aclrtGetDeviceIdFromExceptionInfo(const aclrtExceptionInfo *info) { return info ? info->deviceid : 0xFFFFFFFFU; }
uint32_t aclrtGetErrorCodeFromExceptionInfo(const aclrtExceptionInfo *info) { return info ? info->retcode : 0xFFFFFFFFU; }

aclError aclrtGetArgsFromExceptionInfo(const aclrtExceptionInfo *info, void **devArgsPtr, uint32_t *devArgsLen) {
  if (info == nullptr || devArgsPtr == nullptr || devArgsLen == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetArgsFromExceptionInfo: info, devArgsPtr or devArgsLen is NULL");
  if (info->function == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetArgsFromExceptionInfo: the failed task is not a kernel launch");
  *devArgsPtr = const_cast<void *>(info->args);
  *devArgsLen = info->args_len;
  return ACL_SUCCESS;
}

aclError aclrtGetFuncHandleFromExceptionInfo(const aclrtExceptionInfo *info, aclrtFuncHandle *func) {
  if (info == nullptr || func == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetFuncHandleFromExceptionInfo: info or func is NULL");
  if (info->function == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetFuncHandleFromExceptionInfo: the failed task is not a kernel launch");
  *func = info->function;
  return ACL_SUCCESS;
}

}  // extern "C"
