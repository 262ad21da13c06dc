// Structured outputs through llguidance (guidance-ai's grammar engine, from its PyPI wheel): its C interface is
// exported by the wheel's shared library, which the engine opens at run time, so the core links nothing new and a
// machine without the wheel runs everything but constrained requests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/grammar/grammar_matcher.h"

namespace deepinfer {

struct LlguidanceOptions {
  std::string library_path;         // the wheel's extension module (llguidance/_lib*.so)
  std::string tokenizer_json;       // the text of the checkpoint's Hugging Face tokenizer.json
  int32_t vocab_size = 0;           // the model's: masks have ceil(vocab_size / 32) words
  int32_t eos_token_id = -1;        // what a complete grammar allows next
};

// Opens the library and builds the tokenizer's token trie (about a second for DeepSeek's 129k tokens). Throws with
// the library's path or message when either fails.
std::unique_ptr<GrammarCompiler> make_llguidance_compiler(const LlguidanceOptions& options);

}  // namespace deepinfer
