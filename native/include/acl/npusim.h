/*
 * npusim-only extensions: the software NPU's kernels, observability and daemon administration.
 * A real CANN runtime has none of these; code that must also run on CANN looks them up with dlsym.
 */
#ifndef NPUSIM_ACL_NPUSIM_H_
#define NPUSIM_ACL_NPUSIM_H_

#include "acl_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Kernels. Pointers are device addresses on the stream's device (NULL stream: the default stream of
 * the current device); float data is float32. Like any launch, they only queue the work. */
ACL_FUNC_VISIBILITY aclError npusimLaunchFill(void *dst, size_t count, float value, aclrtStream stream);
ACL_FUNC_VISIBILITY aclError npusimLaunchCopy(void *dst, const void *src, size_t size, aclrtStream stream);
/* y[i] = alpha * x[i] + y[i] for i < n */
ACL_FUNC_VISIBILITY aclError npusimLaunchAxpy(size_t n, float alpha, const void *x, void *y, aclrtStream stream);
/* c[m,n] = a[m,k] . b[k,n], row-major */
ACL_FUNC_VISIBILITY aclError npusimLaunchMatmul(size_t m, size_t n, size_t k, const void *a, const void *b,
                                                void *c, aclrtStream stream);

/* One-line JSON object describing this process's device state, written NUL-terminated into buf:
 * {"state": "RUNNING|LOCKED|BACKED_UP", "devices": [..], "allocations": N, "bytes": B,
 *  "streams": N, "events": N, "connected": bool}.
 * Returns the length written, or a negative aclError (-ACL_ERROR_INVALID_PARAM if buf is too small). */
ACL_FUNC_VISIBILITY int npusimSnapshotInfo(char *buf, size_t len);

/* aclrtSnapShotProcessLock with the caller's bound on the wait for in-flight work (CANN's call
 * waits 60 s): a tool that gives up after timeoutMs leaves the process unlocked at once. */
ACL_FUNC_VISIBILITY aclError npusimSnapShotProcessLockTimeout(int pid, int32_t timeoutMs);

/* Daemon administration, for tools: the daemon's status as one JSON object
 * {"pid": N, "socket": "...", "devices": [{"id", "total", "used", "free"}],
 *  "clients": [{"pid", "bytes", "allocations", "streams", "connections"}]}.
 * On success *needed is the JSON length; if it does not fit len (NUL included), nothing is written
 * and ACL_ERROR_INVALID_PARAM is returned with *needed set. */
ACL_FUNC_VISIBILITY aclError npusimDaemonStatus(const char *socketPath, char *buf, size_t len, size_t *needed);
/* Asks the daemon on socketPath to exit; returns once it has acknowledged. */
ACL_FUNC_VISIBILITY aclError npusimDaemonShutdown(const char *socketPath);

/* The direct path for device memory (native/npusim/export.h): the daemon itself writes a locked
 * client's allocations to files and reads them back, so the data never passes through the client.
 *
 * npusimSnapshotSetDataPath(1): the next aclrtSnapShotProcessBackup saves allocations, streams and
 * events but copies no allocation data, then releases the device as usual (export the data first!).
 * The Restore that follows re-creates every allocation at its address, without data, and leaves the
 * process LOCKED; Unlock is refused until npusimDaemonImport has filled the allocations. Unlock from
 * BACKED_UP is refused after an external backup. 0 (the default): CANN's in-process copy. The
 * setting applies to one Backup. npusimSnapshotGetDataPath: bit 0 = the next Backup is external,
 * bit 1 = the backup held now is external. */
ACL_FUNC_VISIBILITY aclError npusimSnapshotSetDataPath(int external);
ACL_FUNC_VISIBILITY int npusimSnapshotGetDataPath(void);
#define NPUSIM_DATA_PATH_NEXT_EXTERNAL 1 /* npusimSnapshotGetDataPath: the next Backup is external */
#define NPUSIM_DATA_PATH_HELD_EXTERNAL 2 /* npusimSnapshotGetDataPath: the backup held now is external */

/* HCCL across a snapshot (native/npusim/hccl_snapshot.cpp): "rendezvous" DIR (absolute; a private
 * directory, fresh for each restore) is where the ranks of a restored set meet to re-form their
 * communicators (rank 0 publishes its new root there, the others wait for it); "alone" "1": the
 * next Lock admits the collectives peers already issued but does not wait for every rank to be
 * locking (a rank checkpointed without its peers). 0, or ACL_ERROR_INVALID_PARAM. */
ACL_FUNC_VISIBILITY int npusimHcclSnapshotOption(const char *key, const char *value);

/* Between Backup and Restore (BACKED_UP: no connection to any daemon open), the daemon the next
 * Restore reconnects to: a process restored on another host must use *that* host's daemon, not the
 * NPUSIM_SOCKET it started with. socket: absolute, in a directory owned by root or this user and
 * writable by nobody else (as at aclInit). npusimHcclSnapshotOption("socket", PATH) calls it (the
 * agent's `hccl socket PATH`). 0, ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_NO_PERMISSION (an untrusted
 * directory) or ACL_ERROR_SNAPSHOT_RESTORE_FAILED (not backed up). */
ACL_FUNC_VISIBILITY int npusimSnapShotUseDaemon(const char *socket);

/* For tools: export / import the device memory of client pid (which must be locked and idle) into /
 * from the absolute directory dir, one file per device (dev<N>.img). expected (may be NULL):
 * "NAME SIZE XXH3_128_HEX" lines; the import then reads exactly those files and refuses any whose
 * size or checksum differs. *resultJson receives a malloc'd JSON object the caller free()s, on
 * success {"files": [{"path", "size", "checksum"}], "allocations", "bytes", "nonzero_bytes",
 * "written_bytes"|"read_bytes", "seconds"}, on failure {"error": "...", "errno": N}. */
ACL_FUNC_VISIBILITY aclError npusimDaemonExport(const char *socketPath, int pid, const char *dir, char **resultJson);
ACL_FUNC_VISIBILITY aclError npusimDaemonImport(const char *socketPath, int pid, const char *dir, const char *expected,
                                                char **resultJson);
/* Incremental device images: npusimDaemonExportIncremental writes only the chunks written since the
 * export of the image in parentDir (its devN.img files; NULL: a full export) and references the
 * rest ("referenced_bytes" in the result); a parent of another process is refused.
 * npusimDaemonImportChain imports such images: ancestors lists the directories of the image's
 * parent, grandparent, ... one per line (NULL or "": none), whose devN.img files hold the
 * referenced chunks; each is checked against its XXH3-64 as it is read. */
ACL_FUNC_VISIBILITY aclError npusimDaemonExportIncremental(const char *socketPath, int pid, const char *dir,
                                                           const char *parentDir, char **resultJson);
ACL_FUNC_VISIBILITY aclError npusimDaemonImportChain(const char *socketPath, int pid, const char *dir,
                                                     const char *expected, const char *ancestors, char **resultJson);
/* npusimDaemonExportIncremental with flags: NPUSIM_EXPORT_NO_SYNC leaves the files' fsync (and
 * their directory's) to the caller, who must do it before relying on them (npusnap's seal does,
 * while CRIU dumps meanwhile); the daemon only starts their write-back. NPUSIM_EXPORT_KEEP (a live
 * checkpoint's export): the daemon then keeps pid's device memory across the Release of its next
 * Backup, so that the external restore that follows takes it back at the same addresses with the
 * data in place: that restore's Unlock needs no import. Kept memory the restore does not take back
 * is freed at its end, at an Unlock, or once pid is gone. */
#define NPUSIM_EXPORT_NO_SYNC 1u
#define NPUSIM_EXPORT_KEEP 2u
/* NPUSIM_EXPORT_SNAPSHOT: write the images from pid's snapshot (npusimDaemonSnapshot) instead,
 * whether pid is locked or runs; the snapshot ends with this call, written or not. With dir NULL
 * nothing is written: the snapshot just ends. */
#define NPUSIM_EXPORT_SNAPSHOT 4u
ACL_FUNC_VISIBILITY aclError npusimDaemonExportFlags(const char *socketPath, int pid, const char *dir,
                                                     const char *parentDir, unsigned flags, char **resultJson);
/* A live checkpoint's device backup in microseconds: the daemon snapshots locked pid's device
 * memory copy-on-write (until the images are written from it, the first write to a chunk copies
 * it aside first, at most capBytes of copies at once: a write beyond waits for the write-out to
 * pass that chunk) and keeps the memory across the next Release, as NPUSIM_EXPORT_KEEP does. The
 * result has no files ("snapshot": true); npusimDaemonExportFlags with NPUSIM_EXPORT_SNAPSHOT
 * writes them, its result's "copied_bytes" says how much was copied aside. */
ACL_FUNC_VISIBILITY aclError npusimDaemonSnapshot(const char *socketPath, int pid, unsigned long long capBytes,
                                                  char **resultJson);
/* Lazy restore: npusimDaemonImportLazy checks the images' structure like npusimDaemonImportChain and
 * returns before their data is in ("lazy": true in the result): the client may unlock and run at
 * once, each chunk is read and checked against its XXH3-64 on the first task that touches it (or by
 * the daemon's background fill, which also checks each file's XXH3-128), and a chunk that fails
 * makes every task touching it fail with ACL_ERROR_RT_DEVICE_MEM_ERROR. npusimDaemonLazyStatus
 * reports that fill, waiting up to waitMs for its end: {"state": "none"|"filling"|"done"|"failed",
 * "chunks", "ready", "bad", "bytes", "seconds", "errors": [...]}. */
ACL_FUNC_VISIBILITY aclError npusimDaemonImportLazy(const char *socketPath, int pid, const char *dir,
                                                    const char *expected, const char *ancestors, char **resultJson);
/* Import ahead (a restore's, while CRIU restores the process): npusimDaemonImportAhead reads and
 * checks the images like npusimDaemonImportChain, for process pid (started at startTime: field 22 of
 * /proc/PID/stat) before its runtime has reconnected, into memory the daemon makes from the images'
 * index and keeps for it (as NPUSIM_EXPORT_KEEP does): the external Restore that follows takes it back
 * at the same addresses, with the data in place, so no import is due. npusimDaemonImportIfDue is
 * npusimDaemonImportChain, except that it reads nothing ("in_place": true in the result) when the
 * restored client awaits no import. A failed import ahead keeps nothing: the restore imports. */
ACL_FUNC_VISIBILITY aclError npusimDaemonImportAhead(const char *socketPath, int pid, unsigned long long startTime,
                                                     const char *dir, const char *expected, const char *ancestors,
                                                     char **resultJson);
ACL_FUNC_VISIBILITY aclError npusimDaemonImportIfDue(const char *socketPath, int pid, const char *dir,
                                                     const char *expected, const char *ancestors, char **resultJson);
ACL_FUNC_VISIBILITY aclError npusimDaemonLazyStatus(const char *socketPath, int pid, int waitMs, char **resultJson);

/* cann-kernel-host: the launch behind every aclrtlaunch_<kernel> that npusim's ascendc.cmake
 * generates for an AscendC kernel library. binary (binarySize bytes, embedded in the library) is the
 * library's npusim device binary, loaded once per process; args are the kernel's arguments one after
 * the other, as aclrtKernelArgsAppend would put them. binary NULL: the kernel has no npusim
 * implementation, and the launch fails with ACL_ERROR_RT_FEATURE_NOT_SUPPORT and an
 * aclGetRecentErrMsg naming the kernel and saying how to supply one. printBytes > 0: the kernel
 * prints (AscendC::printf); it gets a device buffer of that size as one more argument (its address),
 * headed by two uint64 (bytes used, capacity), and once the kernel has run on the stream, the text
 * is written to the process's stdout (CANN prints a kernel's output on the host the same way). */
ACL_FUNC_VISIBILITY aclError npusimAscendcLaunch(const char *library, const char *kernel, const void *binary,
                                                 size_t binarySize, uint32_t blockDim, aclrtStream stream,
                                                 const void *args, size_t argsSize, size_t printBytes);

#ifdef __cplusplus
}
#endif

#endif /* NPUSIM_ACL_NPUSIM_H_ */
