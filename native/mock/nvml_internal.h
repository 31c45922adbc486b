/* Shared between the mock NVML's source files (nvml_api.c owns the device handles). */
#ifndef GPUSHARE_MOCK_NVML_INTERNAL_H
#define GPUSHARE_MOCK_NVML_INTERNAL_H

#include "gpushare/driver_types.h"

/* NVML initialised and `device` a valid handle: NVML_SUCCESS and its index in *index. */
nvmlReturn_t mock_nvml_check_device(nvmlDevice_t device, int *index);
/* The handle of device `index` (0 <= index < device count). */
nvmlDevice_t mock_nvml_handle(int index);
/* NVML_SUCCESS once nvmlInit has been called (and not shut down as often). */
nvmlReturn_t mock_nvml_check_init(void);

#endif /* GPUSHARE_MOCK_NVML_INTERNAL_H */
