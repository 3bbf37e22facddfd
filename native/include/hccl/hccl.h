/*
 * npusim: the HCCL collective communication API (hccl/hccl.h), the subset training uses.
 * Signatures follow CANN's HCCL. Link with -lhccl (and -lascendcl / -lacl_rt).
 *
 * Collectives are tasks on an aclrtStream: they return once queued and run in stream order;
 * their failures (a peer gone, HCCL_EXEC_TIMEOUT) are reported by the stream's next
 * synchronize. Environment: HCCL_CONNECT_TIMEOUT (init rendezvous, s, default 120),
 * HCCL_EXEC_TIMEOUT (a collective waiting for its peers, s, default 1836, 0 = never),
 * HCCL_IF_IP (the root's address that HcclGetRootInfo hands out), HCCL_IF_BASE_PORT (the
 * root daemon's port for HcclCommInitClusterInfo, default 60000).
 */
#ifndef NPUSIM_HCCL_HCCL_H_
#define NPUSIM_HCCL_HCCL_H_

#include <hccl/hccl_types.h>
#include <acl/acl.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NPUSIM_HCCL_API __attribute__((visibility("default")))

/* Communicators. */
extern NPUSIM_HCCL_API HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo);
extern NPUSIM_HCCL_API HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                                HcclComm *comm);
/* clusterInfo: the path of a rank table file (JSON, CANN's "server_list" format). */
extern NPUSIM_HCCL_API HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm);
extern NPUSIM_HCCL_API HcclResult HcclCommDestroy(HcclComm comm);
extern NPUSIM_HCCL_API HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize);
extern NPUSIM_HCCL_API HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank);
extern NPUSIM_HCCL_API const char *HcclGetErrorString(HcclResult code);

/* Collectives. */
extern NPUSIM_HCCL_API HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType,
                                         HcclReduceOp op, HcclComm comm, aclrtStream stream);
extern NPUSIM_HCCL_API HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root,
                                         HcclComm comm, aclrtStream stream);
extern NPUSIM_HCCL_API HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount,
                                             HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                                             aclrtStream stream);
extern NPUSIM_HCCL_API HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType,
                                         HcclComm comm, aclrtStream stream);
extern NPUSIM_HCCL_API HcclResult HcclReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType,
                                      HcclReduceOp op, uint32_t root, HcclComm comm, aclrtStream stream);
extern NPUSIM_HCCL_API HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank,
                                    HcclComm comm, aclrtStream stream);
extern NPUSIM_HCCL_API HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank,
                                    HcclComm comm, aclrtStream stream);
extern NPUSIM_HCCL_API HcclResult HcclBarrier(HcclComm comm, aclrtStream stream);

/*
 * npusim only, for debugging and tools: one line of JSON describing comm
 * ({"comm": "<16 hex>", "rank": R, "ranks": N, "seq": S, "daemon_issued": S, "daemon_completed": C,
 * "broken": bool}); S is the communicator's sequence number (collectives issued by this rank).
 * Returns the length written, or -1.
 */
extern NPUSIM_HCCL_API int npusimHcclCommInfo(HcclComm comm, char *buf, uint64_t len);

#ifdef __cplusplus
}
#endif

#endif /* NPUSIM_HCCL_HCCL_H_ */
