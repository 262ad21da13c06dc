#include "core/env_flag.h"

#include <cstdlib>
#include <cstring>

namespace deepinfer {

bool env_flag_on(const char* value) { return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0; }

bool env_flag(const char* name) { return env_flag_on(std::getenv(name)); }

}  // namespace deepinfer
