#include "model/quantized_modules.h"

#include "core/error.h"

namespace deepinfer {
namespace {

constexpr std::string_view kRegexPrefix = "re:";

bool glob_match(std::string_view text, std::string_view pattern) {
  // Iterative wildcard matching with one backtrack point: the last '*' seen.
  size_t t = 0, p = 0, star = std::string_view::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++t, ++p;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++, resume = t;
    } else if (star != std::string_view::npos) {
      p = star + 1, t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// The per-expert name a fused experts tensor stands for, so lists written against per-expert modules apply.
std::string unfused(std::string_view module) {
  for (const auto& [fused, first] : {std::pair{std::string_view{"experts.gate_up_proj"}, "experts.0.gate_proj"},
                                     std::pair{std::string_view{"experts.down_proj"}, "experts.0.down_proj"}}) {
    if (module.ends_with(fused)) return std::string(module.substr(0, module.size() - fused.size())) + first;
  }
  return std::string(module);
}

}  // namespace

QuantizedModules::QuantizedModules(Matching matching, std::vector<std::string> targets,
                                   std::vector<std::string> ignored, std::string_view where)
    : matching_(matching) {
  targets_ = compile(std::move(targets), where);
  ignored_ = compile(std::move(ignored), where);
}

std::vector<QuantizedModules::Pattern> QuantizedModules::compile(std::vector<std::string> patterns,
                                                                 std::string_view where) const {
  std::vector<Pattern> compiled;
  compiled.reserve(patterns.size());
  for (std::string& text : patterns) {
    Pattern p{.text = std::move(text)};
    if (matching_ == Matching::kCompressedTensors && p.text.starts_with(kRegexPrefix)) {
      try {
        p.regex.emplace(p.text.substr(kRegexPrefix.size()));
      } catch (const std::regex_error& e) {
        throw InvalidArgument(str_cat(where, ": '", p.text, "' is not a regular expression DeepInfer reads (",
                                      e.what(), ")"));
      }
    }
    compiled.push_back(std::move(p));
  }
  return compiled;
}

bool QuantizedModules::matches(std::string_view module, const Pattern& pattern) const {
  switch (matching_) {
    case Matching::kCompressedTensors:
      if (pattern.regex) {
        return std::regex_search(module.begin(), module.end(), *pattern.regex,
                                 std::regex_constants::match_continuous);
      }
      return pattern.text == module || pattern.text == "Linear";
    case Matching::kSubstring:
      return module.find(pattern.text) != std::string_view::npos;
    case Matching::kGlob:
      // The name itself, then each dotted prefix: excluding "model.layers.0.mlp" excludes the projections in it.
      for (size_t end = module.size(); end != std::string_view::npos && end > 0; end = module.rfind('.', end - 1)) {
        if (glob_match(module.substr(0, end), pattern.text)) return true;
      }
      return false;
  }
  return false;
}

bool QuantizedModules::any_match(std::string_view module, const std::vector<Pattern>& patterns) const {
  for (const Pattern& p : patterns) {
    if (matches(module, p)) return true;
  }
  return false;
}

bool QuantizedModules::quantizes(std::string_view module) const {
  if (!has_exclusions()) return true;
  const std::string name = unfused(module);
  return (targets_.empty() || any_match(name, targets_)) && !any_match(name, ignored_);
}

std::string_view module_of(std::string_view tensor_name) {
  constexpr std::string_view kWeight = ".weight";
  return tensor_name.ends_with(kWeight) ? tensor_name.substr(0, tensor_name.size() - kWeight.size()) : tensor_name;
}

}  // namespace deepinfer
