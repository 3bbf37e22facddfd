/*
 * npusim: aclnnAdd, out = self + alpha * other (CANN's aclnnop/aclnn_add.h). npusim computes it
 * with an npusim kernel; same-shape tensors of ACL_FLOAT or ACL_INT32, a scalar of the same type.
 */
#ifndef NPUSIM_ACLNNOP_ACLNN_ADD_H_
#define NPUSIM_ACLNNOP_ACLNN_ADD_H_

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

ACL_FUNC_VISIBILITY aclnnStatus aclnnAddGetWorkspaceSize(const aclTensor *self, const aclTensor *other,
                                                         const aclScalar *alpha, aclTensor *out,
                                                         uint64_t *workspaceSize, aclOpExecutor **executor);
ACL_FUNC_VISIBILITY aclnnStatus aclnnAdd(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                         aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* NPUSIM_ACLNNOP_ACLNN_ADD_H_ */
