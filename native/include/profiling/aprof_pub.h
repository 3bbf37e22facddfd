/*
 * npusim: the part of CANN's profiling/aprof_pub.h (libprofapi) that programs call to register a
 * model id for profiling; signatures as in CANN. A registered id can be subscribed to with
 * aclprofModelSubscribe (acl/acl_prof.h).
 */
#ifndef NPUSIM_PROFILING_APROF_PUB_H_
#define NPUSIM_PROFILING_APROF_PUB_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if (defined(_WIN32) || defined(_WIN64) || defined(_MSC_VER))
#define MSVP_PROF_API __declspec(dllexport)
#else
#define MSVP_PROF_API __attribute__((visibility("default")))
#endif

/* Registers model id geModelIdx as running on deviceId. Returns 0 on success. */
MSVP_PROF_API int32_t MsprofSetDeviceIdByGeModelIdx(const uint32_t geModelIdx, const uint32_t deviceId);
/* Removes the registration (same id and device). Returns 0 on success, -1 when there is none. */
MSVP_PROF_API int32_t MsprofUnsetDeviceIdByGeModelIdx(const uint32_t geModelIdx, const uint32_t deviceId);

#ifdef __cplusplus
}
#endif

#endif /* NPUSIM_PROFILING_APROF_PUB_H_ */
