/*
 * npusim: the AscendCL umbrella header. npusim implements the runtime part (acl_rt.h) only.
 */
#ifndef NPUSIM_ACL_ACL_H_
#define NPUSIM_ACL_ACL_H_

#include "acl_rt.h"

#endif /* NPUSIM_ACL_ACL_H_ */
