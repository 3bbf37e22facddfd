// System and device queries: run mode, SoC name and architecture, package versions, device
// attributes and capabilities, data type sizes and fp16 conversion.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "runtime.h"

using namespace npusim::rt;

namespace {

// The simulated device calls itself what it is; programs only print it or compare it with itself.
constexpr const char *kSocName = "npusim";
// The CANN release whose acl_rt.h npusim follows.
constexpr int32_t kMajor = 9, kMinor = 1, kPatch = 0;
constexpr const char *kVersionStr = "9.1.0";
// Cores the simulated device reports (blocks of a launch run on host threads).
constexpr int64_t kCubeCores = 8, kVectorCores = 16;

bool known_package(const char *name) {
  return std::strcmp(name, "runtime") == 0 || std::strcmp(name, "cann") == 0 ||
         std::strcmp(name, "toolkit") == 0;
}

}  // namespace

namespace npusim::rt {

aclError device_known(int64_t device, const char *api) {
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return note_error(ACL_ERROR_UNINITIALIZE, std::string(api) + ": aclInit was not called");
  if (device < 0 || static_cast<uint64_t>(device) >= r.pool.device_count)
    return note_error(ACL_ERROR_RT_INVALID_DEVICEID, std::string(api) + ": no device " + std::to_string(device));
  return ACL_SUCCESS;
}

}  // namespace npusim::rt

extern "C" {

aclError aclrtGetRunMode(aclrtRunMode *runMode) {
  if (runMode == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetRunMode: runMode is NULL");
  *runMode = ACL_HOST;  // the program runs on the host, the device is a separate party
  return ACL_SUCCESS;
}

// Needs no aclInit (CANN's samples ask for it before initializing, to pick a build target).
const char *aclrtGetSocName() { return kSocName; }

aclError aclrtCheckArchCompatibility(const char *socVersion, int32_t *canCompatible) {
  if (socVersion == nullptr || canCompatible == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtCheckArchCompatibility: NULL argument");
  *canCompatible = std::strcmp(socVersion, kSocName) == 0 ? 1 : 0;
  return ACL_SUCCESS;
}

aclError aclsysGetVersionStr(char *pkgName, char *versionStr) {
  if (pkgName == nullptr || versionStr == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclsysGetVersionStr: NULL argument");
  if (!known_package(pkgName))
    return note_error(ACL_ERROR_INVALID_FILE, std::string("aclsysGetVersionStr: no package ") + pkgName);
  std::strcpy(versionStr, kVersionStr);  // CANN: the caller's buffer holds ACL_PKG_VERSION_MAX_SIZE (128)
  return ACL_SUCCESS;
}

aclError aclsysGetVersionNum(char *pkgName, int32_t *versionNum) {
  if (pkgName == nullptr || versionNum == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclsysGetVersionNum: NULL argument");
  if (!known_package(pkgName))
    return note_error(ACL_ERROR_INVALID_FILE, std::string("aclsysGetVersionNum: no package ") + pkgName);
  *versionNum = kMajor * 10000 + kMinor * 100 + kPatch;
  return ACL_SUCCESS;
}

aclError aclsysGetCANNVersion(aclCANNPackageName name, aclCANNPackageVersion *version) {
  if (version == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclsysGetCANNVersion: version is NULL");
  if (name != ACL_PKG_NAME_CANN && name != ACL_PKG_NAME_RUNTIME && name != ACL_PKG_NAME_TOOLKIT)
    return note_error(ACL_ERROR_INVALID_FILE, "aclsysGetCANNVersion: npusim has no such package");
  std::memset(version, 0, sizeof(*version));
  std::snprintf(version->version, sizeof(version->version), "%s", kVersionStr);
  std::snprintf(version->majorVersion, sizeof(version->majorVersion), "%d", kMajor);
  std::snprintf(version->minorVersion, sizeof(version->minorVersion), "%d", kMinor);
  std::snprintf(version->patchVersion, sizeof(version->patchVersion), "%d", kPatch);
  return ACL_SUCCESS;
}

aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion, int32_t *patchVersion) {
  if (majorVersion == nullptr || minorVersion == nullptr || patchVersion == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetVersion: NULL argument");
  *majorVersion = ACL_MAJOR_VERSION;
  *minorVersion = ACL_MINOR_VERSION;
  *patchVersion = ACL_PATCH_VERSION;
  return ACL_SUCCESS;
}

aclError aclrtGetDeviceInfo(uint32_t deviceId, aclrtDevAttr attr, int64_t *value) {
  if (value == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceInfo: value is NULL");
  if (aclError rc = device_known(deviceId, "aclrtGetDeviceInfo"); rc != ACL_SUCCESS) return rc;
  switch (attr) {
    case ACL_DEV_ATTR_AICPU_CORE_NUM: *value = std::max(1u, std::thread::hardware_concurrency()); break;
    case ACL_DEV_ATTR_AICORE_CORE_NUM:
    case ACL_DEV_ATTR_CUBE_CORE_NUM: *value = kCubeCores; break;
    case ACL_DEV_ATTR_VECTOR_CORE_NUM: *value = kVectorCores; break;
    case ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE: {
      std::lock_guard<std::mutex> g(runtime().mu);
      *value = static_cast<int64_t>(runtime().pool.memory);
      break;
    }
    case ACL_DEV_ATTR_PHY_CHIP_ID: *value = deviceId; break;
    case ACL_DEV_ATTR_SMP_ID:
    case ACL_DEV_ATTR_IS_VIRTUAL: *value = 0; break;
    default:
      return note_error(ACL_ERROR_FEATURE_UNSUPPORTED,
                        "aclrtGetDeviceInfo: attribute " + std::to_string(attr) + " is not modelled by npusim");
  }
  return ACL_SUCCESS;
}

aclError aclrtGetDeviceCapability(int32_t deviceId, aclrtDevFeatureType devFeatureType, int32_t *value) {
  if (value == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCapability: value is NULL");
  if (aclError rc = device_known(deviceId, "aclrtGetDeviceCapability"); rc != ACL_SUCCESS) return rc;
  if (devFeatureType != ACL_FEATURE_TSCPU_TASK_UPDATE_SUPPORT_AIC_AIV &&
      devFeatureType != ACL_FEATURE_SYSTEM_MEMQ_EVENT_CROSS_DEV)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCapability: unknown feature");
  *value = ACL_DEV_FEATURE_NOT_SUPPORT;  // neither task update nor cross-device memory queues
  return ACL_SUCCESS;
}

// aclrtGetResInCurrentThread: res_limit.cpp (the limits set with aclrt*ResLimit).

aclError aclGetCannAttributeList(const aclCannAttr **cannAttrList, size_t *num) {
  static const aclCannAttr kAttrs[] = {ACL_CANN_ATTR_INF_NAN, ACL_CANN_ATTR_BF16, ACL_CANN_ATTR_JIT_COMPILE};
  if (cannAttrList == nullptr || num == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclGetCannAttributeList: NULL argument");
  *cannAttrList = kAttrs;
  *num = sizeof(kAttrs) / sizeof(kAttrs[0]);
  return ACL_SUCCESS;
}

aclError aclGetCannAttribute(aclCannAttr cannAttr, int32_t *value) {
  if (value == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclGetCannAttribute: value is NULL");
  switch (cannAttr) {
    case ACL_CANN_ATTR_INF_NAN: *value = 1; break;      // host float arithmetic keeps Inf/NaN
    case ACL_CANN_ATTR_BF16: *value = 0; break;         // no bf16 kernels
    case ACL_CANN_ATTR_JIT_COMPILE: *value = 0; break;  // no online operator compiler
    default: return note_error(ACL_ERROR_INVALID_PARAM, "aclGetCannAttribute: unknown attribute");
  }
  return ACL_SUCCESS;
}

size_t aclDataTypeSize(aclDataType dataType) {
  switch (dataType) {
    case ACL_BOOL: case ACL_INT8: case ACL_UINT8: case ACL_HIFLOAT8: case ACL_FLOAT8_E5M2:
    case ACL_FLOAT8_E4M3FN: case ACL_FLOAT8_E8M0: case ACL_FLOAT6_E3M2: case ACL_FLOAT6_E2M3:
    case ACL_FLOAT4_E2M1: case ACL_FLOAT4_E1M2: case ACL_INT4: case ACL_UINT1: return 1;
    case ACL_FLOAT16: case ACL_BF16: case ACL_INT16: case ACL_UINT16: return 2;
    case ACL_FLOAT: case ACL_INT32: case ACL_UINT32: case ACL_COMPLEX32: return 4;
    case ACL_INT64: case ACL_UINT64: case ACL_DOUBLE: case ACL_COMPLEX64: return 8;
    case ACL_COMPLEX128: return 16;
    default: return 0;
  }
}

float aclFloat16ToFloat(aclFloat16 value) {
  const uint32_t sign = (value >> 15) & 1u, exp = (value >> 10) & 0x1fu, man = value & 0x3ffu;
  if (exp == 0x1f) return man != 0 ? 98304.0f : (sign ? -65536.0f : 65536.0f);  // CANN's NaN/Inf
  float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -24)
                       : std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  return sign ? -mag : mag;
}

aclFloat16 aclFloatToFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  if (std::isnan(value)) return static_cast<aclFloat16>(sign | 0x7e00u);
  float mag = std::fabs(value);
  if (mag >= 65520.0f) return static_cast<aclFloat16>(sign | 0x7c00u);  // rounds past the largest half
  if (mag < std::ldexp(1.0f, -25)) return sign;
  int e;
  std::frexp(mag, &e);  // mag = f * 2^e, f in [0.5, 1)
  int exp = e + 14;     // biased half exponent of mag
  if (exp <= 0) {       // subnormal: units of 2^-24
    return static_cast<aclFloat16>(sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(mag, 24))));
  }
  uint32_t man = static_cast<uint32_t>(std::nearbyint(std::ldexp(mag, 11 - e)));  // 11 bits, round-to-even
  if (man == 0x800u) {  // rounding carried into the exponent
    man = 0x400u;
    ++exp;
  }
  if (exp >= 0x1f) return static_cast<aclFloat16>(sign | 0x7c00u);
  return static_cast<aclFloat16>(sign | (exp << 10) | (man & 0x3ffu));
}

}  // extern "C"
