/*
 * npusim: the bounds-checked memory and string functions CANN ships with its toolkit (libc_sec,
 * "securec.h"), as CANN's samples call them. Each checks the destination's size first and
 * returns EOK (0) or an error code; a failed copy leaves the destination zeroed or empty.
 */
#ifndef NPUSIM_SECUREC_H_
#define NPUSIM_SECUREC_H_

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef EOK
#define EOK 0
#endif
typedef int errno_t;

/* Error codes (as libc_sec's): a NULL pointer, a too small destination, overlapping ranges. */
#define ERANGE_AND_RESET 162
#define EINVAL_AND_RESET 150
#define EOVERLAP_AND_RESET 182

#define SECUREC_API __attribute__((visibility("default")))

SECUREC_API errno_t memset_s(void *dest, size_t destMax, int c, size_t count);
SECUREC_API errno_t memcpy_s(void *dest, size_t destMax, const void *src, size_t count);
SECUREC_API errno_t memmove_s(void *dest, size_t destMax, const void *src, size_t count);
SECUREC_API errno_t strcpy_s(char *strDest, size_t destMax, const char *strSrc);
SECUREC_API errno_t strncpy_s(char *strDest, size_t destMax, const char *strSrc, size_t count);
SECUREC_API errno_t strcat_s(char *strDest, size_t destMax, const char *strSrc);
/* The number of characters written, or -1 (the destination then holds an empty string). */
SECUREC_API int sprintf_s(char *strDest, size_t destMax, const char *format, ...);
SECUREC_API int snprintf_s(char *strDest, size_t destMax, size_t count, const char *format, ...);
SECUREC_API int vsnprintf_s(char *strDest, size_t destMax, size_t count, const char *format, va_list argList);

#ifdef __cplusplus
}
#endif

#endif /* NPUSIM_SECUREC_H_ */
