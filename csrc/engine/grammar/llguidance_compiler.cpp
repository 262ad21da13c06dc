// The llguidance compiler and matcher over the library's C interface (declared here, as the library documents it:
// only the entry points and structs this file uses).
#include "engine/grammar/llguidance_compiler.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace deepinfer {
namespace {

// The library's C structs, field for field. Zero-initialized before use, as the library asks, so fields a newer
// release appends read as their defaults.
struct LlgTokenizerInit {
  uint32_t vocab_size;
  uint32_t tok_eos;
  const uint32_t* token_lens;
  const uint8_t* token_bytes;
  const char* tokenizer_json;
  bool tokenize_assumes_string;
  void* tokenize_fn;
  bool use_approximate_greedy_tokenize_fn;
  const void* tokenize_user_data;
  const char* const* slices;
};

struct LlgParserLimits {
  size_t max_items_in_row;
  uint64_t initial_lexer_fuel;
  uint64_t step_lexer_fuel;
  size_t step_max_items;
  size_t max_lexer_states;
  size_t max_grammar_size;
  bool precompute_large_lexemes;
  bool verbose_errors;
};

struct LlgConstraintInit {
  const void* tokenizer;
  uint32_t log_buffer_level;
  uint32_t log_stderr_level;
  bool ff_tokens_ok;
  bool backtrack_ok;
  LlgParserLimits limits;
};

using Tokenizer = void;
using Matcher = void;

// The entry points, resolved once. The library is never unloaded: the Python module that ships it stays loaded.
struct LlgApi {
  Tokenizer* (*new_tokenizer)(const LlgTokenizerInit*, char*, size_t);
  void (*free_tokenizer)(Tokenizer*);
  void (*constraint_init_set_defaults)(LlgConstraintInit*, const Tokenizer*);
  Matcher* (*new_matcher)(const LlgConstraintInit*, const char*, const char*);
  void (*free_matcher)(Matcher*);
  const char* (*matcher_get_error)(Matcher*);
  size_t (*matcher_get_mask_byte_size)(const Matcher*);
  int32_t (*matcher_compute_mask_into)(Matcher*, uint32_t*, size_t);
  int32_t (*matcher_consume_token)(Matcher*, uint32_t);
  int32_t (*matcher_validate_tokens)(Matcher*, const uint32_t*, size_t);
  int32_t (*matcher_rollback)(Matcher*, size_t);
  bool (*matcher_is_stopped)(const Matcher*);

  explicit LlgApi(const std::string& path) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    DI_CHECK(handle != nullptr, "structured outputs: cannot open the llguidance library ", path, ": ", dlerror());
    const auto resolve = [&](auto& fn, const char* name) {
      void* symbol = dlsym(handle, name);
      DI_CHECK(symbol != nullptr, "structured outputs: the llguidance library ", path, " has no ", name,
               " (a release older than the pinned one?)");
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(symbol);
    };
    resolve(new_tokenizer, "llg_new_tokenizer");
    resolve(free_tokenizer, "llg_free_tokenizer");
    resolve(constraint_init_set_defaults, "llg_constraint_init_set_defaults");
    resolve(new_matcher, "llg_new_matcher");
    resolve(free_matcher, "llg_free_matcher");
    resolve(matcher_get_error, "llg_matcher_get_error");
    resolve(matcher_get_mask_byte_size, "llg_matcher_get_mask_byte_size");
    resolve(matcher_compute_mask_into, "llg_matcher_compute_mask_into");
    resolve(matcher_consume_token, "llg_matcher_consume_token");
    resolve(matcher_validate_tokens, "llg_matcher_validate_tokens");
    resolve(matcher_rollback, "llg_matcher_rollback");
    resolve(matcher_is_stopped, "llg_matcher_is_stopped");
  }
};

// The tokenizer's token trie, shared by every matcher made from it: the library must not free it while a matcher
// uses it, and a request's matcher may outlive the compiler (requests end after the engine's other members).
struct TokenizerHandle {
  std::shared_ptr<const LlgApi> api;
  Tokenizer* tokenizer = nullptr;

  TokenizerHandle(std::shared_ptr<const LlgApi> a, Tokenizer* t) : api(std::move(a)), tokenizer(t) {}
  TokenizerHandle(const TokenizerHandle&) = delete;
  TokenizerHandle& operator=(const TokenizerHandle&) = delete;
  ~TokenizerHandle() { api->free_tokenizer(tokenizer); }
};

const char* constraint_type(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::kJsonSchema: return "json_schema";
    case GrammarKind::kRegex: return "regex";
    case GrammarKind::kLark: return "lark";
    case GrammarKind::kNone: break;
  }
  DI_CHECK_ARG(false, "structured outputs: no grammar given");
  return "";
}

class LlguidanceMatcher final : public GrammarMatcher {
 public:
  LlguidanceMatcher(std::shared_ptr<const TokenizerHandle> tokenizer, Matcher* matcher, int32_t eos_token_id)
      : tokenizer_(std::move(tokenizer)), matcher_(matcher), eos_token_id_(eos_token_id) {}
  LlguidanceMatcher(const LlguidanceMatcher&) = delete;
  LlguidanceMatcher& operator=(const LlguidanceMatcher&) = delete;
  ~LlguidanceMatcher() override { api().free_matcher(matcher_); }

  void fill_allowed(std::span<uint32_t> allowed) override {
    // The library's mask covers the tokenizer's tokens, which may outnumber the model's vocabulary (a tokenizer
    // larger than the embedding): then it is computed aside and cut to the vocabulary, whose tokens come first.
    const size_t bytes = api().matcher_get_mask_byte_size(matcher_);
    const bool aside = bytes != allowed.size_bytes();
    if (aside) scratch_.resize(bytes / sizeof(uint32_t));
    uint32_t* mask = aside ? scratch_.data() : allowed.data();
    if (api().matcher_compute_mask_into(matcher_, mask, bytes) != 0) {
      std::fill(allowed.begin(), allowed.end(), 0u);  // an error: end the request (consume() reports it)
      if (eos_token_id_ >= 0 && static_cast<size_t>(eos_token_id_ / 32) < allowed.size()) {
        allowed[static_cast<size_t>(eos_token_id_ / 32)] |= 1u << (eos_token_id_ % 32);
      }
      return;
    }
    if (!aside) return;
    const size_t words = std::min(allowed.size(), scratch_.size());
    std::copy_n(scratch_.begin(), words, allowed.begin());
    std::fill(allowed.begin() + static_cast<std::ptrdiff_t>(words), allowed.end(), 0u);
  }

  bool consume(int32_t token) override {
    return token >= 0 && api().matcher_consume_token(matcher_, static_cast<uint32_t>(token)) == 0;
  }

  int32_t num_valid(std::span<const int32_t> tokens) override {
    for (int32_t t : tokens) {
      if (t < 0) return 0;  // never a token id: the library takes unsigned ones
    }
    static_assert(sizeof(int32_t) == sizeof(uint32_t));
    const int32_t n = api().matcher_validate_tokens(matcher_, reinterpret_cast<const uint32_t*>(tokens.data()),
                                                    tokens.size());
    return std::max(n, 0);  // an error: none
  }

  void rollback(int32_t num_tokens) override {
    DI_CHECK(num_tokens >= 0 && api().matcher_rollback(matcher_, static_cast<size_t>(num_tokens)) == 0,
             "structured outputs: the grammar cannot take back ", num_tokens, " tokens: ", error());
  }

  bool is_terminated() const override { return api().matcher_is_stopped(matcher_); }

  std::string error() const override {
    const char* message = api().matcher_get_error(matcher_);
    return message == nullptr ? std::string() : std::string(message);
  }

 private:
  const LlgApi& api() const { return *tokenizer_->api; }

  std::shared_ptr<const TokenizerHandle> tokenizer_;
  Matcher* matcher_;
  int32_t eos_token_id_;
  std::vector<uint32_t> scratch_;  // the library's mask when it is not the sampler's size
};

class LlguidanceCompiler final : public GrammarCompiler {
 public:
  explicit LlguidanceCompiler(const LlguidanceOptions& o) : eos_token_id_(o.eos_token_id) {
    DI_CHECK(o.vocab_size > 0, "structured outputs: vocabulary size ", o.vocab_size);
    auto api = std::make_shared<const LlgApi>(o.library_path);
    DI_CHECK(!o.tokenizer_json.empty(), "structured outputs: no tokenizer.json given");
    LlgTokenizerInit init{};
    init.vocab_size = static_cast<uint32_t>(o.vocab_size);
    init.tok_eos = static_cast<uint32_t>(std::max(o.eos_token_id, 0));
    init.tokenizer_json = o.tokenizer_json.c_str();
    // The library tokenizes only to force tokens or heal them, which a matcher that only masks does not do; its
    // built-in greedy tokenizer spares a callback into Python's tokenizer from the library's threads.
    init.use_approximate_greedy_tokenize_fn = true;
    std::array<char, 1024> message{};
    Tokenizer* tokenizer = api->new_tokenizer(&init, message.data(), message.size());
    DI_CHECK(tokenizer != nullptr, "structured outputs: llguidance cannot load the tokenizer: ", message.data());
    tokenizer_ = std::make_shared<const TokenizerHandle>(std::move(api), tokenizer);
  }

  std::unique_ptr<GrammarMatcher> compile(const GrammarSpec& spec) override {
    const LlgApi& api = *tokenizer_->api;
    LlgConstraintInit init{};
    api.constraint_init_set_defaults(&init, tokenizer_->tokenizer);
    init.log_stderr_level = 0;  // a bad grammar is the request's error, not a line on the server's stderr
    Matcher* matcher = api.new_matcher(&init, constraint_type(spec.kind), spec.text.c_str());
    auto result = std::make_unique<LlguidanceMatcher>(tokenizer_, matcher, eos_token_id_);
    const std::string error = result->error();
    DI_CHECK_ARG(error.empty(), "invalid ", to_string(spec.kind), " grammar: ", error);
    return result;
  }

 private:
  std::shared_ptr<const TokenizerHandle> tokenizer_;
  int32_t eos_token_id_;
};

}  // namespace

std::unique_ptr<GrammarCompiler> make_llguidance_compiler(const LlguidanceOptions& options) {
  return std::make_unique<LlguidanceCompiler>(options);
}

}  // namespace deepinfer
