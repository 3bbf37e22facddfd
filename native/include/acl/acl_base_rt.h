/*
 * npusim: tensor formats (CANN's acl_base_rt.h, the subset npusim uses: the operator API's
 * aclCreateTensor takes them; aclDataType is in acl_base.h) and the task-group handle. Values as in CANN.
 */
#ifndef NPUSIM_ACL_ACL_BASE_RT_H_
#define NPUSIM_ACL_ACL_BASE_RT_H_

#ifdef __cplusplus
extern "C" {
#endif

typedef void *aclrtTaskGrp;  /* a group of captured tasks of a model run instance */
typedef void *aclrtLabel;      /* a position in a model run instance (aclrtSetLabel) */
typedef void *aclrtLabelList;  /* the targets of aclrtSwitchLabelByIndex */

typedef enum {
    ACL_FORMAT_UNDEFINED = -1,
    ACL_FORMAT_NCHW = 0,
    ACL_FORMAT_NHWC = 1,
    ACL_FORMAT_ND = 2,
    ACL_FORMAT_NC1HWC0 = 3,
    ACL_FORMAT_FRACTAL_Z = 4,
    ACL_FORMAT_NC1HWC0_C04 = 12,
    ACL_FORMAT_HWCN = 16,
    ACL_FORMAT_NDHWC = 27,
    ACL_FORMAT_FRACTAL_NZ = 29,
    ACL_FORMAT_NCDHW = 30,
    ACL_FORMAT_NDC1HWC0 = 32,
    ACL_FRACTAL_Z_3D = 33,
    ACL_FORMAT_NC = 35,
    ACL_FORMAT_NCL = 47,
    ACL_FORMAT_FRACTAL_NZ_C0_16 = 50,
    ACL_FORMAT_FRACTAL_NZ_C0_32 = 51,
    ACL_FORMAT_FRACTAL_NZ_C0_2 = 52,
    ACL_FORMAT_FRACTAL_NZ_C0_4 = 53,
    ACL_FORMAT_FRACTAL_NZ_C0_8 = 54,
} aclFormat;

#ifdef __cplusplus
}
#endif

#endif /* NPUSIM_ACL_ACL_BASE_RT_H_ */
