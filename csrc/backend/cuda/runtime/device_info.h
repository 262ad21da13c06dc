// What the engine asks of the GPU before it sizes the latent cache: how many devices there are and how much memory.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

int device_count();  // 0 when there is no driver or no device

struct DeviceMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
DeviceMemory device_memory(int device_index);

}  // namespace deepinfer::cuda
