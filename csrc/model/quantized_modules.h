// Which linear modules a quantized checkpoint's config says it quantized: its lists of targets and of layers left
// in their dtype, matched the way the library that wrote the checkpoint matches them. The loader itself reads the
// format from the tensors (a layer stored as X.weight_packed is 4-bit whatever a list says); these lists answer for
// what has no tensors to look at: the memory plan of a config.json and the random weights a benchmark rounds.
#pragma once

#include <cstdint>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

class QuantizedModules {
 public:
  enum class Matching : uint8_t {
    kCompressedTensors,  // "re:PATTERN" matches from the name's start (Python's re.match), else the exact name;
                         // the class name "Linear" as a target matches every linear module
    kSubstring,          // AutoAWQ's modules_to_not_convert, as vLLM reads it: a key anywhere in the name
    kGlob,               // ModelOpt's exclude_modules: '*' and '?' wildcards over the name or a dotted prefix of it
  };

  QuantizedModules() = default;  // every linear module quantized
  // `targets` empty: every linear module is a target. Throws InvalidArgument naming `where` for a bad regex.
  QuantizedModules(Matching matching, std::vector<std::string> targets, std::vector<std::string> ignored,
                   std::string_view where);

  // Whether the linear module `module` ("model.layers.3.self_attn.q_b_proj", no ".weight") is stored quantized.
  // transformers 5's fused experts ("...mlp.experts.gate_up_proj") answer as their first expert's gate_proj does.
  bool quantizes(std::string_view module) const;
  bool has_exclusions() const { return !targets_.empty() || !ignored_.empty(); }

 private:
  struct Pattern {
    std::string text;
    std::optional<std::regex> regex;  // compressed-tensors' "re:" patterns, compiled once
  };
  std::vector<Pattern> compile(std::vector<std::string> patterns, std::string_view where) const;
  bool matches(std::string_view module, const Pattern& pattern) const;
  bool any_match(std::string_view module, const std::vector<Pattern>& patterns) const;

  Matching matching_ = Matching::kCompressedTensors;
  std::vector<Pattern> targets_;
  std::vector<Pattern> ignored_;
};

// The tensor name's module ("X.weight" -> "X"; fused expert tensors keep their name).
std::string_view module_of(std::string_view tensor_name);

}  // namespace deepinfer
