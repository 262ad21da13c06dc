// Backend::moe as the composition that defines it (ops/moe.h): the router's logits when it is given, routing, then the
// experts on its ids and weights. This is the CPU reference, and the meaning a fused path must reproduce.
#include "backend/backend.h"

namespace deepinfer {

void Backend::moe(const MoeArgs& a) {
  a.validate();  // the shapes of both halves, before anything is written
  if (a.router.data != nullptr) linear({.x = a.x, .w = a.router, .out = a.router_logits});
  moe_route(a.route);
  moe_experts(a.experts());
}

}  // namespace deepinfer
