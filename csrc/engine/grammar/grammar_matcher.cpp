#include "engine/grammar/grammar_matcher.h"

namespace deepinfer {

const char* to_string(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::kNone: return "none";
    case GrammarKind::kJsonSchema: return "json_schema";
    case GrammarKind::kRegex: return "regex";
    case GrammarKind::kLark: return "lark";
  }
  return "unknown";
}

}  // namespace deepinfer
