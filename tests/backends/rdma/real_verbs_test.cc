// The FakeVerbs flow against the real libibverbs: two endpoints of one NIC
// connected to each other (loopback), WRITE and READ moving bytes, and a
// remote access error. Skipped, saying why, where the machine has no usable
// RDMA device (CI, most laptops).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "rdma_engine.h"

namespace castmesh {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kAllAccess = CASTMESH_RDMA_ACCESS_LOCAL_WRITE | CASTMESH_RDMA_ACCESS_REMOTE_READ |
                                CASTMESH_RDMA_ACCESS_REMOTE_WRITE;

class RealVerbs : public ::testing::Test {
 protected:
  void SetUp() override {
    castmesh_error_v1 error{};
    const int32_t status = rdma_engine_open_device(rdma_real_verbs(), nullptr, 1, 0, &device_, &error);
    if (status == CASTMESH_STATUS_NO_DEVICE || status == CASTMESH_STATUS_NO_DRIVER) {
      GTEST_SKIP() << "no usable RDMA device on this machine: " << error.message;
    }
    ASSERT_EQ(status, CASTMESH_STATUS_OK) << error.message;
    for (Side* side : {&a_, &b_}) {
      ASSERT_EQ(rdma_engine_create_endpoint(device_, 16, &side->handle, side->blob, &error), CASTMESH_STATUS_OK)
          << error.message;
    }
    ASSERT_EQ(rdma_engine_connect_endpoint(device_, a_.handle, b_.blob, sizeof b_.blob, &error), CASTMESH_STATUS_OK)
        << error.message;
    ASSERT_EQ(rdma_engine_connect_endpoint(device_, b_.handle, a_.blob, sizeof a_.blob, &error), CASTMESH_STATUS_OK)
        << error.message;
  }

  void TearDown() override { rdma_engine_close_device(device_); }

  struct Side {
    uint64_t handle = 0;
    uint8_t blob[CASTMESH_RDMA_ENDPOINT_BLOB_SIZE] = {};
  };

  castmesh_rdma_mr_info_v1 reg(void* addr, uint64_t length, uint32_t access) {
    castmesh_rdma_mr_info_v1 info{};
    info.struct_size = sizeof info;
    castmesh_error_v1 error{};
    EXPECT_EQ(rdma_engine_register_memory(device_, addr, length, access, &info, &error), CASTMESH_STATUS_OK)
        << error.message;
    return info;
  }

  // Polls until one completion arrives; a bound so a broken fabric fails the
  // test instead of hanging it.
  castmesh_rdma_completion_v1 wait_one(const Side& side) {
    castmesh_rdma_completion_v1 completion{};
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < give_up) {
      uint32_t count = 0;
      castmesh_error_v1 error{};
      EXPECT_EQ(rdma_engine_poll(device_, side.handle, &completion, 1, &count, &error), CASTMESH_STATUS_OK)
          << error.message;
      if (count == 1) return completion;
      std::this_thread::yield();
    }
    ADD_FAILURE() << "no completion";
    return completion;
  }

  castmesh_rdma_device_v1* device_ = nullptr;
  Side a_;
  Side b_;
};

TEST_F(RealVerbs, WriteAndReadMoveBytesBetweenTwoEndpoints) {
  std::vector<uint8_t> local(4096);
  std::vector<uint8_t> remote(4096, 0);
  for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<uint8_t>(i * 7);
  const castmesh_rdma_mr_info_v1 lmr = reg(local.data(), local.size(), kAllAccess);
  const castmesh_rdma_mr_info_v1 rmr = reg(remote.data(), remote.size(), kAllAccess);
  castmesh_rdma_op_v1 write{};
  write.wr_id = 1;
  write.opcode = CASTMESH_RDMA_OP_WRITE;
  write.local_addr = reinterpret_cast<uint64_t>(local.data());
  write.remote_addr = reinterpret_cast<uint64_t>(remote.data());
  write.length = local.size();
  write.lkey = lmr.lkey;
  write.rkey = rmr.rkey;
  castmesh_error_v1 error{};
  ASSERT_EQ(rdma_engine_post(device_, a_.handle, &write, 1, nullptr, &error), CASTMESH_STATUS_OK) << error.message;
  castmesh_rdma_completion_v1 done = wait_one(a_);
  ASSERT_EQ(done.status, CASTMESH_STATUS_OK) << done.message;
  EXPECT_EQ(remote, local);

  std::vector<uint8_t> back(4096, 0);
  const castmesh_rdma_mr_info_v1 bmr = reg(back.data(), back.size(), CASTMESH_RDMA_ACCESS_LOCAL_WRITE);
  castmesh_rdma_op_v1 read = write;
  read.wr_id = 2;
  read.opcode = CASTMESH_RDMA_OP_READ;
  read.local_addr = reinterpret_cast<uint64_t>(back.data());
  read.lkey = bmr.lkey;
  ASSERT_EQ(rdma_engine_post(device_, b_.handle, &read, 1, nullptr, &error), CASTMESH_STATUS_OK) << error.message;
  done = wait_one(b_);
  ASSERT_EQ(done.status, CASTMESH_STATUS_OK) << done.message;
  EXPECT_EQ(back, local);
}

TEST_F(RealVerbs, WritingAReadOnlyRegistrationIsARemoteAccessError) {
  std::vector<uint8_t> local(64, 1);
  std::vector<uint8_t> remote(64, 0);
  const castmesh_rdma_mr_info_v1 lmr = reg(local.data(), local.size(), kAllAccess);
  const castmesh_rdma_mr_info_v1 rmr = reg(remote.data(), remote.size(), CASTMESH_RDMA_ACCESS_REMOTE_READ);
  castmesh_rdma_op_v1 write{};
  write.wr_id = 3;
  write.opcode = CASTMESH_RDMA_OP_WRITE;
  write.local_addr = reinterpret_cast<uint64_t>(local.data());
  write.remote_addr = reinterpret_cast<uint64_t>(remote.data());
  write.length = local.size();
  write.lkey = lmr.lkey;
  write.rkey = rmr.rkey;
  castmesh_error_v1 error{};
  ASSERT_EQ(rdma_engine_post(device_, a_.handle, &write, 1, nullptr, &error), CASTMESH_STATUS_OK) << error.message;
  const castmesh_rdma_completion_v1 done = wait_one(a_);
  EXPECT_EQ(done.status, CASTMESH_STATUS_PERMISSION_DENIED) << done.message;
  EXPECT_THAT(done.message, HasSubstr("remote access error"));
  EXPECT_EQ(remote, std::vector<uint8_t>(64, 0));
}

}  // namespace
}  // namespace castmesh
