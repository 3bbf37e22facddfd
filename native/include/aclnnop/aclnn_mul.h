/*
 * npusim: aclnnMul, out = self * other (CANN's aclnnop/aclnn_mul.h). npusim computes it with an
 * npusim kernel; same-shape tensors of ACL_FLOAT or ACL_INT32.
 */
#ifndef NPUSIM_ACLNNOP_ACLNN_MUL_H_
#define NPUSIM_ACLNNOP_ACLNN_MUL_H_

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

ACL_FUNC_VISIBILITY aclnnStatus aclnnMulGetWorkspaceSize(const aclTensor *self, const aclTensor *other, aclTensor *out,
                                                         uint64_t *workspaceSize, aclOpExecutor **executor);
ACL_FUNC_VISIBILITY aclnnStatus aclnnMul(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                         aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* NPUSIM_ACLNNOP_ACLNN_MUL_H_ */
