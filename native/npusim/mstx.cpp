// mstx (mstx/ms_tools_ext.h): marks and ranges recorded by npusim's profiler, through the same
// msproftx calls a program could make itself (profiling.cpp): a mark is aclprofMarkEx, a range is
// aclprofRangeStart/Stop, and a domain's messages read "DOMAIN: message". The stream argument
// places a mark on the device's timeline in CANN; npusim's profiler has host timestamps only.
#include <cstring>
#include <string>

#include "acl/acl_prof.h"
#include "mstx/ms_tools_ext.h"

struct mstxDomainRegistration_st {
  std::string name;
};

namespace {

constexpr size_t kMaxMessage = 128;  // what aclprofSetStampTraceMessage takes

std::string text(const mstxDomainRegistration_st *domain, const char *message) {
  std::string s = domain != nullptr ? domain->name + ": " + message : std::string(message);
  if (s.size() > kMaxMessage) s.resize(kMaxMessage);
  return s;
}

void mark(const mstxDomainRegistration_st *domain, const char *message, aclrtStream stream) {
  if (message == nullptr) return;
  const std::string s = text(domain, message);
  if (!s.empty()) aclprofMarkEx(s.c_str(), s.size(), stream);
}

mstxRangeId range_start(const mstxDomainRegistration_st *domain, const char *message) {
  if (message == nullptr) return MSTX_INVALID_ID;
  const std::string s = text(domain, message);
  void *stamp = aclprofCreateStamp();
  uint32_t id = MSTX_INVALID_ID;
  if (s.empty() || aclprofSetStampTraceMessage(stamp, s.c_str(), static_cast<uint32_t>(s.size())) != ACL_SUCCESS ||
      aclprofRangeStart(stamp, &id) != ACL_SUCCESS)
    id = MSTX_INVALID_ID;
  aclprofDestroyStamp(stamp);  // the range keeps its own copy of the message
  return id;
}

}  // namespace

extern "C" {

void mstxMarkA(const char *message, aclrtStream stream) { mark(nullptr, message, stream); }

mstxRangeId mstxRangeStartA(const char *message, aclrtStream) { return range_start(nullptr, message); }

void mstxRangeEnd(mstxRangeId id) {
  if (id != MSTX_INVALID_ID && id <= UINT32_MAX) aclprofRangeStop(static_cast<uint32_t>(id));
}

mstxDomainHandle_t mstxDomainCreateA(const char *name) {
  if (name == nullptr || name[0] == '\0') return nullptr;
  return new mstxDomainRegistration_st{name};
}

void mstxDomainDestroy(mstxDomainHandle_t domain) { delete domain; }

void mstxDomainMarkA(mstxDomainHandle_t domain, const char *message, aclrtStream stream) {
  if (domain != nullptr) mark(domain, message, stream);
}

mstxRangeId mstxDomainRangeStartA(mstxDomainHandle_t domain, const char *message, aclrtStream) {
  return domain != nullptr ? range_start(domain, message) : MSTX_INVALID_ID;
}

void mstxDomainRangeEnd(mstxDomainHandle_t domain, mstxRangeId id) {
  if (domain != nullptr) mstxRangeEnd(id);
}

}  // extern "C"
