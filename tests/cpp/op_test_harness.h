// The shared harness of the backend op tests.
//
// A case (OpCase) builds its inputs on the host, runs one op (or a short pipeline of ops) on a backend through an
// OpRunner, and returns named outputs. The same case runs two ways:
//   - against its naive formula (straight loops, double accumulation, written in the test): how the CPU backend,
//     the reference, is checked;
//   - against another backend (a device backend against the CPU backend), through the same runner interface.
// The runner allocates every tensor with guard bytes around it, fills outputs with NaN before the op, and checks
// afterwards that no guard byte changed and that no read-only input was written. The comparison fails on any NaN,
// on an infinity on one side only, and when max|got - ref| / max(max|ref|, tiny) exceeds the case's threshold.
// A case the backend under test declines (it throws UnsupportedOp: a dtype or head size its kernels do not take) is
// reported as skipped.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/half.h"
#include "core/tensor.h"

namespace deepinfer::op_test {

// ---------------------------------------------------------------------------------------------------------------
// Host data

// One tensor's bytes on the host, with its dtype and shape.
struct HostTensor {
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<std::byte> bytes;

  static HostTensor f32(Shape shape, std::span<const float> values) {
    DI_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), values.size(), " values for shape ", shape.str());
    return from_raw(shape, DType::kF32, values.data());
  }
  static HostTensor i32(Shape shape, std::span<const int32_t> values) {
    DI_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), values.size(), " values for shape ", shape.str());
    return from_raw(shape, DType::kI32, values.data());
  }
  // Rounds each value to bfloat16 (nearest even).
  static HostTensor bf16(Shape shape, std::span<const float> values) {
    DI_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), values.size(), " values for shape ", shape.str());
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
    return from_raw(shape, DType::kBF16, bits.data());
  }
  static HostTensor from_raw(Shape shape, DType dtype, const void* data) {
    HostTensor t{.dtype = dtype, .shape = shape, .bytes = {}};
    t.bytes.resize(static_cast<size_t>(shape.numel()) * dtype_size(dtype));
    if (!t.bytes.empty()) std::memcpy(t.bytes.data(), data, t.bytes.size());
    return t;
  }

  int64_t numel() const { return shape.numel(); }
  // Every element widened to double (float32, bfloat16 and int32 tensors).
  std::vector<double> to_double() const {
    std::vector<double> out(static_cast<size_t>(numel()));
    for (size_t i = 0; i < out.size(); ++i) {
      switch (dtype) {
        case DType::kF32: {
          float v;
          std::memcpy(&v, bytes.data() + i * 4, 4);
          out[i] = v;
          break;
        }
        case DType::kBF16: {
          uint16_t v;
          std::memcpy(&v, bytes.data() + i * 2, 2);
          out[i] = bf16_to_float(v);
          break;
        }
        case DType::kI32: {
          int32_t v;
          std::memcpy(&v, bytes.data() + i * 4, 4);
          out[i] = v;
          break;
        }
        case DType::kF8E4M3: out[i] = e4m3_to_float(static_cast<uint8_t>(bytes[i])); break;
        default: DI_CHECK(false, "to_double: unsupported dtype ", dtype_name(dtype));
      }
    }
    return out;
  }
};

// Deterministic random inputs.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  std::vector<float> uniform(int64_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(engine_);
    return v;
  }
  int32_t integer(int32_t lo, int32_t hi) {  // inclusive
    return std::uniform_int_distribution<int32_t>(lo, hi)(engine_);
  }
  template <typename T>
  void shuffle(std::vector<T>& v) {
    std::shuffle(v.begin(), v.end(), engine_);
  }

 private:
  std::mt19937_64 engine_;
};

// ---------------------------------------------------------------------------------------------------------------
// Where a backend's tensors live

// The memory of the backend under test. Host memory for the CPU; a device backend copies through its stream.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual Device device() const = 0;
  // Stays valid until the Memory is destroyed.
  virtual void* allocate(size_t bytes) = 0;
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  // Waits for the work queued before it, then copies.
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
};

class HostMemory final : public Memory {
 public:
  Device device() const override { return Device::kCpu; }
  void* allocate(size_t bytes) override {
    buffers_.push_back(allocate_host(std::max<size_t>(bytes, 1)));
    return buffers_.back().data();
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }

 private:
  std::vector<Buffer> buffers_;
};

// ---------------------------------------------------------------------------------------------------------------
// The runner a case sees

enum class Access : uint8_t { kReadOnly, kReadWrite };

class OpRunner {
 public:
  static constexpr size_t kGuardBytes = 256;
  static constexpr std::byte kGuardByte{0xA5};

  OpRunner(Backend& backend, Memory& memory) : backend_(&backend), memory_(memory) {}
  // A runner for kernels called directly, without a Backend.
  explicit OpRunner(Memory& memory) : memory_(memory) {}
  OpRunner(const OpRunner&) = delete;
  OpRunner& operator=(const OpRunner&) = delete;

  Backend& backend() {
    DI_CHECK(backend_ != nullptr, "this runner has no backend");
    return *backend_;
  }
  Device device() const { return memory_.device(); }

  // A guarded copy of `t` in the backend's memory. Read-only inputs are checked unchanged after the op.
  TensorView upload(const HostTensor& t, Access access = Access::kReadOnly) {
    std::byte* data = allocate_guarded(t.bytes.size(), access == Access::kReadOnly ? "read-only input" : "input");
    memory_.copy_to_device(data, t.bytes.data(), t.bytes.size());
    if (access == Access::kReadOnly) allocations_.back().original = t.bytes;
    return {data, t.dtype, t.shape, memory_.device()};
  }

  // A guarded output filled with NaN (float types) or 0x7f7f7f7f (int32): an element the op does not write fails.
  TensorView output(Shape shape, DType dtype) {
    const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    std::byte* data = allocate_guarded(bytes, "output");
    std::vector<std::byte> fill(bytes);
    if (dtype == DType::kF32) {
      const float nan = std::nanf("");
      for (size_t i = 0; i < bytes; i += 4) std::memcpy(&fill[i], &nan, 4);
    } else if (dtype == DType::kBF16) {
      const uint16_t nan = 0x7fc0;
      for (size_t i = 0; i < bytes; i += 2) std::memcpy(&fill[i], &nan, 2);
    } else {
      std::fill(fill.begin(), fill.end(), std::byte{0x7f});
    }
    memory_.copy_to_device(data, fill.data(), bytes);
    return {data, dtype, shape, memory_.device()};
  }

  HostTensor download(const ConstTensorView& t) {
    HostTensor h{.dtype = t.dtype, .shape = t.shape, .bytes = {}};
    h.bytes.resize(static_cast<size_t>(t.numel()) * dtype_size(t.dtype));
    memory_.copy_to_host(h.bytes.data(), t.data, h.bytes.size());
    return h;
  }
  std::vector<double> fetch(const ConstTensorView& t) { return download(t).to_double(); }

  // Guard bands intact and read-only inputs unchanged; one message per problem.
  std::vector<std::string> memory_errors() {
    std::vector<std::string> errors;
    for (size_t a = 0; a < allocations_.size(); ++a) {
      const Allocation& alloc = allocations_[a];
      std::vector<std::byte> host(alloc.bytes + 2 * kGuardBytes);
      memory_.copy_to_host(host.data(), alloc.base, host.size());
      for (size_t i = 0; i < host.size(); ++i) {
        const bool in_guard = i < kGuardBytes || i >= kGuardBytes + alloc.bytes;
        if (in_guard && host[i] != kGuardByte) {
          const int64_t offset = static_cast<int64_t>(i) - static_cast<int64_t>(kGuardBytes);
          errors.push_back(str_cat("guard byte at offset ", offset, " of ", alloc.what, " #", a, " (", alloc.bytes,
                                   " bytes) was overwritten: an out-of-bounds write"));
          break;
        }
      }
      if (!alloc.original.empty() &&
          std::memcmp(host.data() + kGuardBytes, alloc.original.data(), alloc.bytes) != 0) {
        errors.push_back(str_cat(alloc.what, " #", a, " was modified by the op"));
      }
    }
    return errors;
  }

 private:
  struct Allocation {
    std::byte* base = nullptr;
    size_t bytes = 0;
    std::string what;
    std::vector<std::byte> original;  // read-only inputs: the bytes they must still hold
  };

  std::byte* allocate_guarded(size_t bytes, const char* what) {
    auto* base = static_cast<std::byte*>(memory_.allocate(bytes + 2 * kGuardBytes));
    const std::vector<std::byte> guard(kGuardBytes, kGuardByte);
    memory_.copy_to_device(base, guard.data(), kGuardBytes);
    memory_.copy_to_device(base + kGuardBytes + bytes, guard.data(), kGuardBytes);
    allocations_.push_back({.base = base, .bytes = bytes, .what = what, .original = {}});
    return base + kGuardBytes;
  }

  Backend* backend_ = nullptr;
  Memory& memory_;
  std::vector<Allocation> allocations_;
};

// ---------------------------------------------------------------------------------------------------------------
// Cases and their comparison

enum class Compare : uint8_t { kNormalized, kExact };

struct Output {
  std::string name;
  std::vector<double> values;
  Compare compare = Compare::kNormalized;
};
using Outputs = std::vector<Output>;

// kThrows: `run` must throw deepinfer::Error on every backend (a shape or dtype check). kThrowsOnHost: the same
// where the runner's memory is the host; the check reads values of index tensors (token ids, slots, pages), which
// validate() does only in host memory, so a device backend skips the case.
enum class Expect : uint8_t { kMatch, kThrows, kThrowsOnHost };

struct OpCase {
  OpKind op = OpKind::kLinear;
  std::string name;                        // unique; letters, digits and '_'
  std::function<Outputs(OpRunner&)> run;   // builds the inputs on the runner, runs the op, fetches the outputs
  std::function<Outputs()> naive;          // the same outputs from the naive formula (unused for kThrows)
  double tolerance = 1e-5;                 // normalized error allowed for kNormalized outputs
  Expect expect = Expect::kMatch;          // kThrows*: `run` must throw deepinfer::Error (validation)
};

class CaseRegistry {
 public:
  void add(OpCase c) {
    for (char ch : c.name) {
      DI_CHECK(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_', "case name '", c.name,
               "' must hold only letters, digits and '_'");
    }
    for (const OpCase& other : cases_) DI_CHECK(other.name != c.name, "duplicate case name ", c.name);
    cases_.push_back(std::move(c));
  }
  const std::vector<OpCase>& cases() const { return cases_; }
  int64_t count(OpKind op) const {
    return std::count_if(cases_.begin(), cases_.end(), [&](const OpCase& c) { return c.op == op; });
  }

 private:
  std::vector<OpCase> cases_;
};

// Problems between `got` and `ref`, one message each; empty when they match.
inline std::vector<std::string> compare_outputs(const Outputs& got, const Outputs& ref, double tolerance) {
  constexpr double kTiny = 1e-12;
  std::vector<std::string> errors;
  if (got.size() != ref.size()) {
    errors.push_back(str_cat(got.size(), " outputs, expected ", ref.size()));
    return errors;
  }
  for (size_t o = 0; o < ref.size(); ++o) {
    const Output& g = got[o];
    const Output& r = ref[o];
    if (g.name != r.name || g.values.size() != r.values.size()) {
      errors.push_back(str_cat("output ", o, ": got '", g.name, "' of ", g.values.size(), " values, expected '",
                               r.name, "' of ", r.values.size()));
      continue;
    }
    double max_ref = 0.0, max_err = 0.0;
    size_t worst = 0;
    bool bad = false;
    for (size_t i = 0; i < r.values.size() && !bad; ++i) {
      const double gv = g.values[i], rv = r.values[i];
      if (std::isnan(gv) || std::isnan(rv)) {
        errors.push_back(str_cat(r.name, "[", i, "]: NaN (got ", gv, ", expected ", rv, ")"));
        bad = true;
      } else if (std::isinf(gv) || std::isinf(rv)) {
        if (gv != rv) {
          errors.push_back(str_cat(r.name, "[", i, "]: infinity on one side (got ", gv, ", expected ", rv, ")"));
          bad = true;
        }
      } else if (r.compare == Compare::kExact) {
        if (gv != rv) {
          errors.push_back(str_cat(r.name, "[", i, "]: got ", gv, ", expected exactly ", rv));
          bad = true;
        }
      } else {
        max_ref = std::max(max_ref, std::abs(rv));
        const double err = std::abs(gv - rv);
        if (err > max_err) {
          max_err = err;
          worst = i;
        }
      }
    }
    if (bad || r.compare == Compare::kExact) continue;
    const double normalized = max_err / std::max(max_ref, kTiny);
    if (normalized > tolerance) {
      errors.push_back(str_cat(r.name, ": normalized error ", normalized, " > ", tolerance, " (worst [", worst,
                               "]: got ", g.values[worst], ", expected ", r.values[worst], "; max |ref| ", max_ref,
                               ")"));
    }
  }
  return errors;
}

// What running a case on one backend gave.
struct CaseRun {
  std::optional<Outputs> outputs;  // empty when the case threw (as expected or not) or was declined
  std::optional<std::string> unsupported;  // the backend declined the case (UnsupportedOp): report it as skipped
};

inline bool expects_throw(const OpCase& c, const OpRunner& runner) {
  return c.expect == Expect::kThrows || (c.expect == Expect::kThrowsOnHost && runner.device() == Device::kCpu);
}

// Runs the case on `runner`; for kThrows checks that it throws. Adds a failure per memory problem.
inline CaseRun run_checked(const OpCase& c, OpRunner& runner) {
  CaseRun result;
  const std::string where = str_cat(c.name, " on ", runner.backend().name());
  try {
    if (expects_throw(c, runner)) {
      c.run(runner);
      ADD_FAILURE() << where << ": expected a throw";
    } else {
      result.outputs = c.run(runner);
    }
  } catch (const UnsupportedOp& e) {
    result.unsupported = e.what();
  } catch (const Error& e) {
    if (!expects_throw(c, runner)) ADD_FAILURE() << where << " threw: " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << where << " threw a " << (expects_throw(c, runner) ? "non-deepinfer exception: " : "") << e.what();
  }
  for (const std::string& e : runner.memory_errors()) ADD_FAILURE() << where << ": " << e;
  return result;
}

// The backend (normally the CPU reference) against the case's naive formula.
inline void expect_matches_naive(const OpCase& c, Backend& backend, Memory& memory) {
  if (!backend.supports(c.op)) GTEST_SKIP() << backend.name() << " does not support " << op_name(c.op);
  OpRunner runner(backend, memory);
  const CaseRun got = run_checked(c, runner);
  if (got.unsupported) GTEST_SKIP() << backend.name() << " declined: " << *got.unsupported;
  if (!got.outputs) {  // the case expects a throw (checked), or the run threw (recorded as a failure)
    if (!expects_throw(c, runner) && !::testing::Test::HasFailure()) {
      ADD_FAILURE() << c.name << ": nothing to compare, and no failure recorded";
    }
    return;
  }
  for (const std::string& e : compare_outputs(*got.outputs, c.naive(), c.tolerance)) {
    ADD_FAILURE() << c.name << " on " << backend.name() << " vs naive: " << e;
  }
}

// A backend under test against a reference backend (the CPU), both running the same case.
inline void expect_matches_reference(const OpCase& c, Backend& test, Memory& test_memory, Backend& reference,
                                     Memory& reference_memory, double tolerance_scale = 1.0) {
  if (!test.supports(c.op)) GTEST_SKIP() << test.name() << " does not support " << op_name(c.op);
  if (c.expect == Expect::kThrowsOnHost && test_memory.device() != Device::kCpu) {
    GTEST_SKIP() << "a value check: validate() reads index tensors only in host memory";
  }
  OpRunner test_runner(test, test_memory);
  OpRunner reference_runner(reference, reference_memory);
  const CaseRun got = run_checked(c, test_runner);
  if (got.unsupported) GTEST_SKIP() << test.name() << " declined: " << *got.unsupported;
  const CaseRun ref = run_checked(c, reference_runner);
  // A case the reference declines compares nothing: reported as skipped (never as passed).
  if (ref.unsupported) GTEST_SKIP() << reference.name() << " (the reference) declined: " << *ref.unsupported;
  if (!got.outputs || !ref.outputs) {
    // No outputs: the case expects a throw (run_checked checked it), or a run threw (run_checked recorded that).
    if (!expects_throw(c, test_runner) && !::testing::Test::HasFailure()) {
      ADD_FAILURE() << c.name << ": nothing to compare, and no failure recorded";
    }
    return;
  }
  for (const std::string& e : compare_outputs(*got.outputs, *ref.outputs, c.tolerance * tolerance_scale)) {
    ADD_FAILURE() << c.name << " on " << test.name() << " vs " << reference.name() << ": " << e;
  }
}

// The SampledToken rows of a sampling op's output as named outputs: token ids and counts compared exactly, logprobs
// with the case's threshold. Unused entries are zero on both sides.
inline Outputs sampled_token_outputs(const HostTensor& out) {
  DI_CHECK(out.dtype == DType::kI32 && out.bytes.size() % sizeof(SampledToken) == 0, "sampled tokens: ",
           dtype_name(out.dtype), " ", out.shape.str());
  Output token{.name = "token", .values = {}, .compare = Compare::kExact};
  Output counts{.name = "num_top_and_reserved", .values = {}, .compare = Compare::kExact};
  Output top_ids{.name = "top_ids", .values = {}, .compare = Compare::kExact};
  Output logprob{.name = "logprob", .values = {}};
  Output top_logprobs{.name = "top_logprobs", .values = {}};
  for (size_t r = 0; r < out.bytes.size() / sizeof(SampledToken); ++r) {
    SampledToken t;
    std::memcpy(static_cast<void*>(&t), out.bytes.data() + r * sizeof t, sizeof t);
    token.values.push_back(t.token);
    counts.values.push_back(t.num_top);
    counts.values.push_back(t.reserved);
    logprob.values.push_back(t.logprob);
    for (int j = 0; j < kMaxTopLogprobs; ++j) {
      top_ids.values.push_back(t.top_ids[j]);
      top_logprobs.values.push_back(t.top_logprobs[j]);
    }
  }
  return {token, counts, top_ids, logprob, top_logprobs};
}

// One sampling call: rows of logits, their parameters, the token lists their ranges point into, and the grammar
// masks their allowed_row indexes.
struct SampleBatch {
  int64_t vocab = 0;
  std::vector<float> logits;  // [rows, vocab]
  std::vector<SamplingRow> rows;
  std::vector<int32_t> penalty_tokens, penalty_counts, masked_tokens;
  std::vector<int32_t> allowed_tokens;  // [num_allowed_rows(), allowed_words()] bitmaps (ops/sample.h)

  int64_t num_rows() const { return static_cast<int64_t>(rows.size()); }
  int64_t allowed_words() const { return (vocab + 31) / 32; }
  int64_t num_allowed_rows() const {
    return allowed_tokens.empty() ? 0 : static_cast<int64_t>(allowed_tokens.size()) / allowed_words();
  }
  // Appends a grammar mask that allows exactly `tokens` and returns its row (for SamplingRow::allowed_row). The bits
  // of the last word past the vocabulary are set: they stand for no token, and no backend may draw one from them.
  int32_t add_allowed(const std::vector<int32_t>& tokens) {
    const int64_t words = allowed_words();
    std::vector<uint32_t> bits(static_cast<size_t>(words), 0u);
    for (const int32_t t : tokens) {
      DI_CHECK(t >= 0 && t < vocab, "allowed token ", t, " outside [0, ", vocab, ")");
      bits[static_cast<size_t>(t / 32)] |= 1u << (t % 32);
    }
    if (vocab % 32 != 0) bits.back() |= ~0u << (vocab % 32);
    for (const uint32_t w : bits) allowed_tokens.push_back(static_cast<int32_t>(w));
    return static_cast<int32_t>(num_allowed_rows() - 1);
  }
  // Whether row parameters `p` may draw token t (every token without a grammar mask).
  bool allowed(const SamplingRow& p, int32_t t) const {
    if (p.allowed_row < 0) return true;
    const int64_t at = p.allowed_row * allowed_words() + t / 32;
    return ((static_cast<uint32_t>(allowed_tokens[static_cast<size_t>(at)]) >> (t % 32)) & 1u) != 0;
  }
  // Appends a row: its logits, its parameters, its (token, output count) penalties and its masked tokens.
  void add(std::span<const float> row_logits, SamplingRow p,
           const std::vector<std::pair<int32_t, int32_t>>& penalties = {}, const std::vector<int32_t>& masked = {}) {
    DI_CHECK(static_cast<int64_t>(row_logits.size()) == vocab, row_logits.size(), " logits for vocab ", vocab);
    logits.insert(logits.end(), row_logits.begin(), row_logits.end());
    p.penalty_begin = static_cast<int32_t>(penalty_tokens.size());
    for (const auto& [token, count] : penalties) {
      penalty_tokens.push_back(token);
      penalty_counts.push_back(count);
    }
    p.penalty_end = static_cast<int32_t>(penalty_tokens.size());
    p.mask_begin = static_cast<int32_t>(masked_tokens.size());
    masked_tokens.insert(masked_tokens.end(), masked.begin(), masked.end());
    p.mask_end = static_cast<int32_t>(masked_tokens.size());
    rows.push_back(p);
  }
  std::vector<int32_t> row_words() const {
    std::vector<int32_t> words(rows.size() * kSamplingRowWords);
    if (!rows.empty()) {
      std::memcpy(words.data(), static_cast<const void*>(rows.data()), rows.size() * sizeof(SamplingRow));
    }
    return words;
  }
};

// Logits uniform in [-range, range], rounded to multiples of `quantum` when it is positive (ties on purpose).
inline std::vector<float> random_logits(Rng& rng, int64_t vocab, float range, float quantum = 0.0f) {
  std::vector<float> l = rng.uniform(vocab, -range, range);
  if (quantum > 0.0f) {
    for (float& v : l) v = std::round(v / quantum) * quantum;
  }
  return l;
}

// Each row of `params` with its own random logits.
inline SampleBatch random_sample_batch(int64_t vocab, const std::vector<SamplingRow>& params, uint64_t seed,
                                       float range = 4.0f, float quantum = 0.0f) {
  Rng rng(seed);
  SampleBatch b{.vocab = vocab};
  for (const SamplingRow& p : params) b.add(random_logits(rng, vocab, range, quantum), p);
  return b;
}

// Uploads the batch, runs the sampling op on the runner's backend, and returns its outputs.
inline Outputs run_sample_batch(OpRunner& run, const SampleBatch& b) {
  const int64_t n = b.num_rows();
  const auto list = [](const std::vector<int32_t>& v) { return HostTensor::i32({static_cast<int64_t>(v.size())}, v); };
  const TensorView out = run.output({n, kSampledTokenWords}, DType::kI32);
  run.backend().sample({.logits = run.upload(HostTensor::f32({n, b.vocab}, b.logits)),
                        .rows = run.upload(HostTensor::i32({n, kSamplingRowWords}, b.row_words())),
                        .penalty_tokens = run.upload(list(b.penalty_tokens)),
                        .penalty_counts = run.upload(list(b.penalty_counts)),
                        .masked_tokens = run.upload(list(b.masked_tokens)),
                        .allowed_tokens = b.allowed_tokens.empty()
                                              ? ConstTensorView{}
                                              : ConstTensorView(run.upload(HostTensor::i32(
                                                    {b.num_allowed_rows(), b.allowed_words()}, b.allowed_tokens))),
                        .out = out});
  return sampled_token_outputs(run.download(out));
}

// `count` distinct tokens of [0, vocab), drawn at random.
inline std::vector<int32_t> random_tokens(Rng& rng, int64_t vocab, int64_t count) {
  std::vector<int32_t> tokens(static_cast<size_t>(vocab));
  std::iota(tokens.begin(), tokens.end(), 0);
  rng.shuffle(tokens);
  tokens.resize(static_cast<size_t>(count));
  return tokens;
}

// Where a rope case's rotated elements sit in its flat input: tokens x heads slices of rot_dim values.
struct RopeLayout {
  int64_t tokens = 0, heads = 0, rot_dim = 0;
  int64_t offset = 0;        // the rope slice starts this many elements into each head
  int64_t head_stride = 0;   // elements; 0 for a single shared head (the k_pe of a latent row)
  int64_t token_stride = 0;  // elements
};

// DeepSeek's default rope frequencies: 10000^(-2i / rot_dim).
inline std::vector<float> rope_inv_freq(int64_t rot_dim) {
  std::vector<float> inv_freq(static_cast<size_t>(rot_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * double(i) / double(rot_dim)));
  }
  return inv_freq;
}

// true for the elements a rope op rotates; the rest must come out untouched.
inline std::vector<bool> rope_rotated_mask(const RopeLayout& l) {
  std::vector<bool> rotated(static_cast<size_t>(l.tokens * l.token_stride), false);
  for (int64_t t = 0; t < l.tokens; ++t) {
    for (int64_t h = 0; h < l.heads; ++h) {
      for (int64_t i = 0; i < l.rot_dim; ++i) rotated[t * l.token_stride + h * l.head_stride + l.offset + i] = true;
    }
  }
  return rotated;
}

}  // namespace deepinfer::op_test
