// A request's output grammar (structured outputs): the constraint as the request states it, and the matcher that
// follows the request's output through it. The scheduler and the step see only this interface; the grammar engine
// behind it (llguidance_compiler.h) is found at run time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace deepinfer {

enum class GrammarKind : uint8_t {
  kNone,
  kJsonSchema,  // a JSON Schema (text); "{\"type\": \"object\"}" is OpenAI's json_object mode
  kRegex,       // a regular expression the whole output matches (Rust regex syntax)
  kLark,        // a context-free grammar in llguidance's Lark dialect (may embed %json schemas and special tokens)
};

const char* to_string(GrammarKind kind);

struct GrammarSpec {
  GrammarKind kind = GrammarKind::kNone;
  std::string text;

  bool empty() const { return kind == GrammarKind::kNone; }
};

// One request's position in its grammar. Not thread-safe: the engine calls it from one thread at a time (the mask
// fill may run on several threads, each matcher on one).
class GrammarMatcher {
 public:
  virtual ~GrammarMatcher() = default;

  // Sets bit t of `allowed` (word t / 32, bit t % 32) for every token t the grammar allows next, clears the others.
  // `allowed` holds ceil(vocab / 32) words. A matcher in an error state allows only the end of sequence, so the
  // request ends; consume() then reports the error.
  virtual void fill_allowed(std::span<uint32_t> allowed) = 0;
  // Advances over a generated token. False when the grammar rejects it (error() says why).
  virtual bool consume(int32_t token) = 0;
  // How many of `tokens`, from the first, the grammar would accept in order from here; changes nothing. (Speculative
  // decoding keeps the drafts the grammar allows.)
  virtual int32_t num_valid(std::span<const int32_t> tokens) = 0;
  // Takes back the last `num_tokens` consumed (the masks of a verification's rows are filled after its drafts).
  virtual void rollback(int32_t num_tokens) = 0;
  // The grammar is complete and allows nothing but the end of sequence.
  virtual bool is_terminated() const = 0;
  virtual std::string error() const = 0;
};

// Builds matchers. Thread-safe: requests are added from callers' threads.
class GrammarCompiler {
 public:
  virtual ~GrammarCompiler() = default;
  // Throws InvalidArgument naming what is wrong with the grammar.
  virtual std::unique_ptr<GrammarMatcher> compile(const GrammarSpec& spec) = 0;
};

}  // namespace deepinfer
