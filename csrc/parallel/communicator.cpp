#include "parallel/communicator.h"

namespace deepinfer {

std::vector<int64_t> row_offsets(std::span<const int64_t> rows) {
  std::vector<int64_t> offsets(rows.size(), 0);
  int64_t next = 0;
  for (size_t p = 0; p < rows.size(); ++p) {
    offsets[p] = next;
    next += rows[p];
  }
  return offsets;
}

}  // namespace deepinfer
