// The FAKE tensor_engine plugin with its collective library missing (the
// real dlopen failure of te_nccl_dlopen): device collectives fail on every
// rank saying to install NCCL; memory, streams and copies keep working, and
// so do host collectives.
#include <cstdlib>

#include "core/collectives/fake_tensor_engine.h"

namespace castmesh {
namespace {

using testing::fail;
using testing::FakeDeviceMeshTest;
using testing::gpu;
using testing::on_device;
using testing::Outcome;
using testing::to_host;

class NoNcclTest : public FakeDeviceMeshTest {
 protected:
  static void SetUpTestSuite() { setenv("CASTMESH_FAKE_TE_NCCL", "missing", 1); }
};

TEST_F(NoNcclTest, DeviceCollectivesSayToInstallNcclAndTheRestWorks) {
  auto outcomes = run(2, [](Communicator& c) {
    auto buf = on_device<float>({1, 2}, DType::kFloat32, gpu(c.rank()));
    if (!buf.ok()) return fail(buf.status());
    absl::Status st = c.allreduce(*buf, *buf, ReduceOp::kSum);
    const std::string text(st.message());
    std::vector<double> got = {st.code() == absl::StatusCode::kFailedPrecondition ? 1.0 : 0.0,
                               text.find("pip install nvidia-nccl-cu13") != std::string::npos ? 1.0 : 0.0,
                               text.find("libcastmesh-fake-absent-nccl.so.2") != std::string::npos ? 1.0 : 0.0};
    auto back = to_host<float>(*buf);  // copies still work
    if (!back.ok()) return fail(back.status());
    got.insert(got.end(), back->begin(), back->end());
    float v = 1;
    if (absl::Status h = c.allreduce(TensorView::Contiguous(&v, DType::kFloat32, {1}),
                                     TensorView::Contiguous(&v, DType::kFloat32, {1}), ReduceOp::kSum);
        !h.ok()) {
      return fail(h);
    }
    got.push_back(v);
    return Outcome{"", got};
  });
  ASSERT_EQ(outcomes.size(), 2u);
  for (const Outcome& o : outcomes) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.values, (std::vector<double>{1, 1, 1, 1, 2, 2}));
  }
}

}  // namespace
}  // namespace castmesh
