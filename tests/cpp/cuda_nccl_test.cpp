// The NCCL communicator (backend/cuda/parallel): the run-time loader and the unique id's words on the host, then a
// world of one GPU rank, where every device collective is an identity or a copy checked against the host's values,
// the host collectives through NCCL's own bootstrap, an all-reduce and an all-gather recorded in a CUDA graph and
// replayed, and abort. Several ranks need several GPUs: these tests hold the one-rank cases. The *Cuda* tests need a
// GPU and NCCL (pip install nvidia-nccl-cu13, then DEEPINFER_NCCL_LIBRARY or LD_LIBRARY_PATH pointing at it).
#ifdef DEEPINFER_HAVE_CUDA

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/parallel/nccl_communicator.h"
#include "backend/cuda/parallel/nccl_library.h"
#include "core/half.h"
#include "cuda_device_required.h"
#include "parallel/communicator.h"
#include "scoped_env.h"

namespace deepinfer {
namespace {

using op_test::ScopedEnv;

// ---------------------------------------------------------------------------------------------------------------------
// Host only

TEST(NcclLibrary, ErrorNamesThePathsTriedWhenNoneLoads) {
  const std::string missing = "/nonexistent/deepinfer-nccl-test/libnccl.so.2";
  const ScopedEnv env("DEEPINFER_NCCL_LIBRARY", missing.c_str());
  ASSERT_EQ(cuda::nccl_library_candidates(), std::vector<std::string>{missing});
  try {
    cuda::load_nccl_library(cuda::nccl_library_candidates());
    FAIL() << "a library that does not exist loaded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(missing), std::string::npos) << message;
    EXPECT_NE(message.find("pip install nvidia-nccl-cu13"), std::string::npos) << message;
    EXPECT_NE(message.find("DEEPINFER_NCCL_LIBRARY"), std::string::npos) << message;
  }
}

TEST(NcclLibrary, NamesEveryCandidateInOrder) {
  const std::vector<std::string> candidates = {"/nonexistent/a/libnccl.so.2", "/nonexistent/b/libnccl.so.2"};
  try {
    cuda::load_nccl_library(candidates);
    FAIL() << "a library that does not exist loaded";
  } catch (const Error& e) {
    const std::string message = e.what();
    const size_t first = message.find(candidates[0]);
    const size_t second = message.find(candidates[1]);
    ASSERT_NE(first, std::string::npos) << message;
    ASSERT_NE(second, std::string::npos) << message;
    EXPECT_LT(first, second) << message;
  }
}

TEST(NcclLibrary, WithoutTheVariableTheLoaderSearches) {
  const ScopedEnv env("DEEPINFER_NCCL_LIBRARY", "");  // empty counts as unset
  EXPECT_EQ(cuda::nccl_library_candidates(), std::vector<std::string>{"libnccl.so.2"});
}

TEST(NcclUniqueId, PacksIntoWordsAndBackBitExactly) {
  cuda::NcclUniqueId id;
  for (size_t i = 0; i < cuda::kNcclUniqueIdBytes; ++i) id.internal[i] = static_cast<char>(0xff - 7 * i);
  const std::vector<int32_t> words = cuda::unique_id_to_words(id);
  ASSERT_EQ(words.size(), cuda::kNcclUniqueIdBytes / 4);
  const cuda::NcclUniqueId back = cuda::unique_id_from_words(words);
  EXPECT_EQ(std::memcmp(back.internal, id.internal, cuda::kNcclUniqueIdBytes), 0);
  EXPECT_THROW(cuda::unique_id_from_words(std::vector<int32_t>(31)), Error);
  EXPECT_THROW(cuda::unique_id_from_words(std::vector<int32_t>(33)), Error);
}

TEST(NcclCommunicator, RejectsABackendThatIsNotCuda) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  EXPECT_THROW(make_nccl_communicator(*cpu, 0, 1, "127.0.0.1:29500"), Error);
}

// ---------------------------------------------------------------------------------------------------------------------
// One GPU rank

// The host communicator of a world of one rank: every host collective is done at once.
class OneRankHost final : public Communicator {
 public:
  int32_t rank() const override { return 0; }
  int32_t size() const override { return 1; }
  std::string_view name() const override { return "one-rank"; }
  void all_reduce(TensorView) override { throw Error("host only"); }
  void all_gather(ConstTensorView, TensorView) override { throw Error("host only"); }
  void reduce_scatter(ConstTensorView, TensorView) override { throw Error("host only"); }
  void all_to_all(ConstTensorView, std::span<const int64_t>, TensorView, std::span<const int64_t>) override {
    throw Error("host only");
  }
  void broadcast(std::vector<int32_t>&, int32_t) override { ++broadcasts; }
  void all_reduce_host(std::span<int64_t>, HostReduce) override {}
  void barrier() override {}
  void abort(const std::string& reason) override { aborted = reason; }

  int broadcasts = 0;
  std::string aborted;
};

std::vector<float> ramp(int64_t n) {
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i) - 3.0f;
  return values;
}

Tensor on_device(Backend& cuda, const std::vector<float>& values, Shape shape) {
  Tensor t = cuda.empty(shape, DType::kF32);
  cuda.copy_to_device(ConstTensorView(values.data(), DType::kF32, shape, Device::kCpu), t.view());
  return t;
}

std::vector<float> to_host(Backend& cuda, const Tensor& t) {
  std::vector<float> back(static_cast<size_t>(t.numel()), -1.0f);
  cuda.copy_to_host(t.cview(), TensorView{back.data(), DType::kF32, t.shape(), Device::kCpu});
  return back;
}

// A TCP port on the loopback interface that nothing listens on now.
int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 29500;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t length = sizeof addr;
  int port = 29500;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

TEST(CudaNccl, OneRankCollectivesAreIdentitiesOrCopies) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  OneRankHost host;
  const std::unique_ptr<Communicator> comm = make_nccl_communicator(*cuda, host);
  EXPECT_EQ(host.broadcasts, 1);  // the unique id
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->name(), "nccl");

  const std::vector<float> values = ramp(3 * 5);
  {
    Tensor x = on_device(*cuda, values, {3, 5});
    comm->all_reduce(x.view());
    EXPECT_EQ(to_host(*cuda, x), values);
  }
  {
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
    Tensor x = cuda->empty({3, 5}, DType::kBF16);
    cuda->copy_to_device(ConstTensorView(bits.data(), DType::kBF16, {3, 5}, Device::kCpu), x.view());
    comm->all_reduce(x.view());
    std::vector<uint16_t> back(bits.size(), 0xffff);
    cuda->copy_to_host(x.cview(), TensorView{back.data(), DType::kBF16, {3, 5}, Device::kCpu});
    EXPECT_EQ(back, bits);
  }
  {
    const Tensor in = on_device(*cuda, values, {3, 5});
    Tensor out = cuda->zeros({3, 5}, DType::kF32);
    comm->all_gather(in.cview(), out.view());
    EXPECT_EQ(to_host(*cuda, out), values);
  }
  {
    const Tensor in = on_device(*cuda, values, {3, 5});
    Tensor out = cuda->zeros({3, 5}, DType::kF32);
    comm->reduce_scatter(in.cview(), out.view());
    EXPECT_EQ(to_host(*cuda, out), values);
  }
  {
    const Tensor in = on_device(*cuda, values, {3, 5});
    Tensor out = cuda->zeros({3, 5}, DType::kF32);
    const std::vector<int64_t> rows = {3};
    comm->all_to_all(in.cview(), rows, out.view(), rows);
    EXPECT_EQ(to_host(*cuda, out), values);
    const Tensor none_in = cuda->empty({0, 5}, DType::kF32);
    Tensor none_out = cuda->empty({0, 5}, DType::kF32);
    const std::vector<int64_t> no_rows = {0};
    comm->all_to_all(none_in.cview(), no_rows, none_out.view(), no_rows);
    EXPECT_THROW(comm->all_to_all(in.cview(), no_rows, out.view(), rows), Error);  // counts that miss the rows
  }
  {
    std::vector<int32_t> words = {4, -5, 6};
    comm->broadcast(words, 0);
    EXPECT_EQ(words, (std::vector<int32_t>{4, -5, 6}));
    EXPECT_EQ(host.broadcasts, 2);
    EXPECT_THROW(comm->broadcast(words, 1), Error);  // no rank 1
  }
}

TEST(CudaNccl, RejectsHostViewsAndOtherDtypes) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  OneRankHost host;
  const std::unique_ptr<Communicator> comm = make_nccl_communicator(*cuda, host);
  std::vector<float> values = ramp(4);
  EXPECT_THROW(comm->all_reduce(TensorView{values.data(), DType::kF32, {4}, Device::kCpu}), Error);
  Tensor ints = cuda->zeros({4}, DType::kI32);
  EXPECT_THROW(comm->all_reduce(ints.view()), Error);
  const Tensor in = cuda->zeros({2, 4}, DType::kF32);
  Tensor wrong = cuda->zeros({3, 4}, DType::kF32);
  EXPECT_THROW(comm->all_gather(in.cview(), wrong.view()), Error);
}

// The host collectives through NCCL itself (no host communicator): rank 0 listens on the loopback address.
TEST(CudaNccl, BootstrapAddressWorldOfOne) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  const std::string addr = "127.0.0.1:" + std::to_string(free_loopback_port());
  const ScopedEnv env("NCCL_COMM_ID", addr.c_str());  // the factory sets it; this puts the old value back after
  const std::unique_ptr<Communicator> comm = make_nccl_communicator(*cuda, 0, 1, addr, std::chrono::seconds(60));

  std::vector<int32_t> words = {7, -1, 1 << 30, 0};
  comm->broadcast(words, 0);
  EXPECT_EQ(words, (std::vector<int32_t>{7, -1, 1 << 30, 0}));
  std::vector<int32_t> none;
  comm->broadcast(none, 0);
  EXPECT_TRUE(none.empty());
  for (const HostReduce op : {HostReduce::kSum, HostReduce::kMin, HostReduce::kMax}) {
    std::vector<int64_t> values = {5, -3, int64_t{1} << 40};
    comm->all_reduce_host(values, op);
    EXPECT_EQ(values, (std::vector<int64_t>{5, -3, int64_t{1} << 40}));
  }
  comm->barrier();

  const std::vector<float> values = ramp(33);
  Tensor x = on_device(*cuda, values, {33});
  comm->all_reduce(x.view());
  EXPECT_EQ(to_host(*cuda, x), values);
}

// Collectives in a captured graph: the eager warm-up adds 1, each replay 1 more, and the all-gather copies the sum.
TEST(CudaNccl, CapturedAllReduceReplays) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  OneRankHost host;
  const std::unique_ptr<Communicator> comm = make_nccl_communicator(*cuda, host);
  constexpr int64_t n = 4096;
  const Tensor ones = on_device(*cuda, std::vector<float>(n, 1.0f), {1, n});
  Tensor sum = cuda->zeros({1, n}, DType::kF32);
  Tensor gathered = cuda->zeros({1, n}, DType::kF32);
  const std::unique_ptr<StepGraph> graph = cuda->capture([&] {
    cuda->add({.x = sum.view(), .y = ones.cview()});
    comm->all_reduce(sum.view());
    comm->all_gather(sum.cview(), gathered.view());
  });
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(to_host(*cuda, gathered), std::vector<float>(n, 1.0f));
  ASSERT_TRUE(graph->replay());
  ASSERT_TRUE(graph->replay());
  EXPECT_EQ(to_host(*cuda, sum), std::vector<float>(n, 3.0f));
  EXPECT_EQ(to_host(*cuda, gathered), std::vector<float>(n, 3.0f));
}

TEST(CudaNccl, AbortEndsEveryLaterCollectiveNamingTheRank) {
  DEEPINFER_REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<Backend> cuda = make_cuda_backend();
  OneRankHost host;
  const std::unique_ptr<Communicator> comm = make_nccl_communicator(*cuda, host);
  comm->abort("the step threw");
  EXPECT_EQ(host.aborted, "the step threw");
  Tensor x = cuda->zeros({8}, DType::kF32);
  try {
    comm->all_reduce(x.view());
    FAIL() << "an aborted communicator ran a collective";
  } catch (const CollectiveError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 0"), std::string::npos) << message;
    EXPECT_NE(message.find("the step threw"), std::string::npos) << message;
  }
  EXPECT_THROW(comm->barrier(), CollectiveError);
}

}  // namespace
}  // namespace deepinfer

#endif  // DEEPINFER_HAVE_CUDA
