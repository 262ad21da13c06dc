// On/off switches read from the process environment (DEEPINFER_PROFILE_OPS, DEEPINFER_DISABLE_PDL): one rule for
// what turns a switch on.
#pragma once

namespace deepinfer {

// Whether a switch's value turns it on: set, not empty and not "0". Unset (nullptr), "" and "0" leave it off.
bool env_flag_on(const char* value);

// env_flag_on of the environment variable `name`, read at the call.
bool env_flag(const char* name);

}  // namespace deepinfer
