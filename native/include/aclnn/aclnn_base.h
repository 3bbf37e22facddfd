/*
 * npusim: the operator API's base types (CANN's aclnn/aclnn_base.h, the subset npusim implements).
 */
#ifndef NPUSIM_ACLNN_ACLNN_BASE_H_
#define NPUSIM_ACLNN_ACLNN_BASE_H_

#include <stdint.h>

#include "acl/acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t aclnnStatus;

#define OK 0
#define ACLNN_SUCCESS 0
#define ACLNN_ERR_PARAM_NULLPTR 161001
#define ACLNN_ERR_PARAM_INVALID 161002
#define ACLNN_ERR_RUNTIME_ERROR 361001
#define ACLNN_ERR_INNER 561000

typedef struct aclOpExecutor aclOpExecutor;

#ifdef __cplusplus
}
#endif

#endif /* NPUSIM_ACLNN_ACLNN_BASE_H_ */
