// Included first by each host source that npusim's ascendc.cmake generates from an AscendC kernel
// source (its functions that launch kernels with <<<>>>), in place of kernel_operator.h.
#ifndef NPUSIM_ASCENDC_HOST_H_
#define NPUSIM_ASCENDC_HOST_H_
#include <cstddef>
#include <cstdint>
#include "acl/acl_base.h"
#endif
