// The bounds-checked functions of securec.h (CANN's libc_sec), for programs that call them.
#include "securec.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {
constexpr size_t kMax = 0x7fffffffUL;  // libc_sec refuses sizes above 2 GiB as corrupt

bool overlap(const void *a, size_t na, const void *b, size_t nb) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + nb && y < x + na;
}
}  // namespace

extern "C" {

errno_t memset_s(void *dest, size_t destMax, int c, size_t count) {
  if (dest == nullptr || destMax == 0 || destMax > kMax) return EINVAL_AND_RESET;
  if (count > destMax) {
    std::memset(dest, c, destMax);
    return ERANGE_AND_RESET;
  }
  std::memset(dest, c, count);
  return EOK;
}

errno_t memcpy_s(void *dest, size_t destMax, const void *src, size_t count) {
  if (dest == nullptr || destMax == 0 || destMax > kMax) return EINVAL_AND_RESET;
  if (src == nullptr || count > destMax) {
    std::memset(dest, 0, destMax);
    return src == nullptr ? EINVAL_AND_RESET : ERANGE_AND_RESET;
  }
  if (overlap(dest, count, src, count)) {
    std::memset(dest, 0, destMax);
    return EOVERLAP_AND_RESET;
  }
  std::memcpy(dest, src, count);
  return EOK;
}

errno_t memmove_s(void *dest, size_t destMax, const void *src, size_t count) {
  if (dest == nullptr || destMax == 0 || destMax > kMax) return EINVAL_AND_RESET;
  if (src == nullptr || count > destMax) {
    std::memset(dest, 0, destMax);
    return src == nullptr ? EINVAL_AND_RESET : ERANGE_AND_RESET;
  }
  std::memmove(dest, src, count);
  return EOK;
}

errno_t strncpy_s(char *strDest, size_t destMax, const char *strSrc, size_t count) {
  if (strDest == nullptr || destMax == 0 || destMax > kMax) return EINVAL_AND_RESET;
  if (strSrc == nullptr) {
    strDest[0] = '\0';
    return EINVAL_AND_RESET;
  }
  const size_t n = strnlen(strSrc, count);
  if (n >= destMax) {
    strDest[0] = '\0';
    return ERANGE_AND_RESET;
  }
  std::memmove(strDest, strSrc, n);
  strDest[n] = '\0';
  return EOK;
}

errno_t strcpy_s(char *strDest, size_t destMax, const char *strSrc) {
  return strncpy_s(strDest, destMax, strSrc, strSrc ? std::strlen(strSrc) : 0);
}

errno_t strcat_s(char *strDest, size_t destMax, const char *strSrc) {
  if (strDest == nullptr || destMax == 0 || destMax > kMax) return EINVAL_AND_RESET;
  const size_t used = strnlen(strDest, destMax);
  if (used == destMax) {
    strDest[0] = '\0';
    return EINVAL_AND_RESET;  // the destination was not a string
  }
  errno_t rc = strcpy_s(strDest + used, destMax - used, strSrc);
  if (rc != EOK) strDest[0] = '\0';
  return rc;
}

int vsnprintf_s(char *strDest, size_t destMax, size_t count, const char *format, va_list argList) {
  if (strDest == nullptr || destMax == 0 || destMax > kMax || format == nullptr) return -1;
  const bool truncating = count < destMax;  // at most count characters are asked for
  const size_t limit = truncating ? count + 1 : destMax;
  const int n = std::vsnprintf(strDest, limit, format, argList);
  if (n >= 0 && static_cast<size_t>(n) < limit) return n;
  if (!truncating || n < 0) strDest[0] = '\0';  // only an asked-for truncation keeps the text
  return -1;
}

int snprintf_s(char *strDest, size_t destMax, size_t count, const char *format, ...) {
  va_list ap;
  va_start(ap, format);
  const int n = vsnprintf_s(strDest, destMax, count, format, ap);
  va_end(ap);
  return n;
}

int sprintf_s(char *strDest, size_t destMax, const char *format, ...) {
  va_list ap;
  va_start(ap, format);
  const int n = vsnprintf_s(strDest, destMax, destMax - 1, format, ap);
  va_end(ap);
  return n;
}

}  // extern "C"
