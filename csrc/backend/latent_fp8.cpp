// The FP8 latent cache row's host side: the scale rule and the CPU backend's row conversions.
#include "backend/ops/latent_fp8.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/fp8.h"
#include "core/half.h"

namespace deepinfer {

float latent_fp8_scale(float amax) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  const float x = amax / kE4m3Max;
  if (x < std::numeric_limits<float>::min()) return std::numeric_limits<float>::min();  // 2^-126
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t exponent = bits & 0x7f800000u;
  // The smallest power of two >= x: x itself when its mantissa is zero, else the next binade.
  return std::bit_cast<float>((bits & 0x007fffffu) == 0 ? exponent : exponent + 0x00800000u);
}

void quantize_latent_fp8_row(std::span<const float> latent, const LatentFp8Layout& layout, std::span<uint8_t> row) {
  DI_CHECK(static_cast<int64_t>(latent.size()) == layout.rank + layout.rope_dim &&
               static_cast<int64_t>(row.size()) == layout.row_bytes(),
           "quantize_latent_fp8_row: ", latent.size(), " values into ", row.size(), " bytes for rank ", layout.rank,
           " + rope ", layout.rope_dim);
  std::fill(row.begin(), row.end(), uint8_t{0});
  for (int64_t g = 0; g < layout.num_groups(); ++g) {
    const int64_t begin = g * LatentFp8Layout::kGroup, end = std::min(layout.rank, begin + LatentFp8Layout::kGroup);
    float amax = 0.0f;
    for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(latent[static_cast<size_t>(i)]));
    const float scale = latent_fp8_scale(amax);
    const float inverse = 1.0f / scale;  // a power of two: exact
    for (int64_t i = begin; i < end; ++i) row[static_cast<size_t>(i)] = float_to_e4m3(latent[static_cast<size_t>(i)] * inverse);
    std::memcpy(row.data() + layout.scales_offset() + 4 * g, &scale, sizeof(float));
  }
  for (int64_t i = 0; i < layout.rope_dim; ++i) {
    const uint16_t bits = float_to_bf16(latent[static_cast<size_t>(layout.rank + i)]);
    std::memcpy(row.data() + layout.rope_offset() + 2 * i, &bits, sizeof(bits));
  }
}

void dequantize_latent_fp8_row(std::span<const uint8_t> row, const LatentFp8Layout& layout, std::span<float> latent) {
  DI_CHECK(static_cast<int64_t>(latent.size()) == layout.rank + layout.rope_dim &&
               static_cast<int64_t>(row.size()) == layout.row_bytes(),
           "dequantize_latent_fp8_row: ", row.size(), " bytes into ", latent.size(), " values for rank ", layout.rank,
           " + rope ", layout.rope_dim);
  for (int64_t g = 0; g < layout.num_groups(); ++g) {
    float scale;
    std::memcpy(&scale, row.data() + layout.scales_offset() + 4 * g, sizeof(float));
    const int64_t begin = g * LatentFp8Layout::kGroup, end = std::min(layout.rank, begin + LatentFp8Layout::kGroup);
    for (int64_t i = begin; i < end; ++i) {
      latent[static_cast<size_t>(i)] = e4m3_to_float(row[static_cast<size_t>(i)]) * scale;
    }
  }
  for (int64_t i = 0; i < layout.rope_dim; ++i) {
    uint16_t bits;
    std::memcpy(&bits, row.data() + layout.rope_offset() + 2 * i, sizeof(bits));
    latent[static_cast<size_t>(layout.rank + i)] = bf16_to_float(bits);
  }
}

}  // namespace deepinfer
