// Included first by each device source that npusim's ascendc.cmake generates from an AscendC
// kernel source: the host emulation of the kernel API and the npusim kernel contract.
#ifndef NPUSIM_ASCENDC_DEVICE_H_
#define NPUSIM_ASCENDC_DEVICE_H_
#include "kernel_operator.h"
#endif
