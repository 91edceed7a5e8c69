// The rdma backend's logic (backends/rdma/rdma_engine.c) against the fake
// verbs provider: registration cache, endpoint state machine and blob, READ
// and WRITE moving bytes, selective signalling, send-queue accounting and the
// mapping of every completion status.
#include "rdma_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fake_verbs.h"

namespace castmesh {
namespace {

using ::testing::HasSubstr;
namespace fake = fake_verbs;

constexpr uint32_t kAllAccess = CASTMESH_RDMA_ACCESS_LOCAL_WRITE | CASTMESH_RDMA_ACCESS_REMOTE_READ |
                                CASTMESH_RDMA_ACCESS_REMOTE_WRITE;

uint64_t addr_of(const void* p) { return reinterpret_cast<uint64_t>(p); }

castmesh_rdma_mr_info_v1 empty_info() {
  castmesh_rdma_mr_info_v1 info{};
  info.struct_size = sizeof info;
  return info;
}

fake::DeviceSpec nic(const std::string& name, uint16_t lid) {
  fake::DeviceSpec spec;
  spec.name = name;
  spec.lid = lid;
  return spec;
}

class FakeVerbs : public ::testing::Test {
 protected:
  void SetUp() override { fake::reset({nic("fake_a", 1), nic("fake_b", 2)}); }

  void TearDown() override {
    for (castmesh_rdma_device_v1* device : devices_) rdma_engine_close_device(device);
    const fake::LiveObjects live = fake::live();
    EXPECT_EQ(live.contexts + live.pds + live.mrs + live.cqs + live.qps, 0)
        << "contexts " << live.contexts << " pds " << live.pds << " mrs " << live.mrs << " cqs " << live.cqs
        << " qps " << live.qps;
    EXPECT_EQ(fake::cq_overflows(), 0);
  }

  castmesh_rdma_device_v1* open(const char* name) {
    castmesh_rdma_device_v1* device = nullptr;
    castmesh_error_v1 error{};
    const int32_t status = rdma_engine_open_device(fake::ops(), name, 1, 0, &device, &error);
    EXPECT_EQ(status, CASTMESH_STATUS_OK) << error.message;
    if (device != nullptr) devices_.push_back(device);
    return device;
  }

  struct Endpoint {
    castmesh_rdma_device_v1* device = nullptr;
    uint64_t handle = 0;
    uint8_t blob[CASTMESH_RDMA_ENDPOINT_BLOB_SIZE] = {};
  };

  Endpoint create(castmesh_rdma_device_v1* device, uint32_t depth = 0) {
    Endpoint endpoint;
    endpoint.device = device;
    castmesh_error_v1 error{};
    EXPECT_EQ(rdma_engine_create_endpoint(device, depth, &endpoint.handle, endpoint.blob, &error),
              CASTMESH_STATUS_OK)
        << error.message;
    return endpoint;
  }

  int32_t connect(const Endpoint& endpoint, const Endpoint& peer, castmesh_error_v1* error) {
    return rdma_engine_connect_endpoint(endpoint.device, endpoint.handle, peer.blob, sizeof peer.blob, error);
  }

  // Two endpoints on the two fake NICs, connected to each other.
  std::pair<Endpoint, Endpoint> connected_pair(uint32_t depth = 0) {
    Endpoint a = create(a_, depth);
    Endpoint b = create(b_, depth);
    castmesh_error_v1 error{};
    EXPECT_EQ(connect(a, b, &error), CASTMESH_STATUS_OK) << error.message;
    EXPECT_EQ(connect(b, a, &error), CASTMESH_STATUS_OK) << error.message;
    return {a, b};
  }

  castmesh_rdma_mr_info_v1 reg(castmesh_rdma_device_v1* device, void* addr, uint64_t length, uint32_t access) {
    castmesh_rdma_mr_info_v1 info = empty_info();
    castmesh_error_v1 error{};
    EXPECT_EQ(rdma_engine_register_memory(device, addr, length, access, &info, &error), CASTMESH_STATUS_OK)
        << error.message;
    return info;
  }

  int32_t post(const Endpoint& endpoint, const std::vector<castmesh_rdma_op_v1>& ops, castmesh_error_v1* error,
               uint32_t* posted = nullptr) {
    return rdma_engine_post(endpoint.device, endpoint.handle, ops.data(), static_cast<uint32_t>(ops.size()), posted,
                            error);
  }

  std::vector<castmesh_rdma_completion_v1> poll(const Endpoint& endpoint, uint32_t capacity = 64) {
    std::vector<castmesh_rdma_completion_v1> completions(capacity);
    uint32_t count = 0;
    castmesh_error_v1 error{};
    EXPECT_EQ(rdma_engine_poll(endpoint.device, endpoint.handle, completions.data(), capacity, &count, &error),
              CASTMESH_STATUS_OK)
        << error.message;
    completions.resize(count);
    return completions;
  }

  static castmesh_rdma_op_v1 op(uint32_t opcode, uint64_t wr_id, const void* local, uint32_t lkey,
                                const void* remote, uint32_t rkey, uint64_t length, uint32_t flags = 0) {
    castmesh_rdma_op_v1 o{};
    o.wr_id = wr_id;
    o.opcode = opcode;
    o.flags = flags;
    o.local_addr = addr_of(local);
    o.remote_addr = addr_of(remote);
    o.length = length;
    o.lkey = lkey;
    o.rkey = rkey;
    return o;
  }

  void SetUpDevices() {
    a_ = open("fake_a");
    b_ = open("fake_b");
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
  }

  std::vector<castmesh_rdma_device_v1*> devices_;
  castmesh_rdma_device_v1* a_ = nullptr;
  castmesh_rdma_device_v1* b_ = nullptr;
};

// ---- capability query and devices ----

TEST_F(FakeVerbs, QueryListsEveryDeviceWithItsFacts) {
  std::vector<castmesh_device_info_v1> devices(4);
  for (auto& device : devices) device.struct_size = sizeof device;
  uint32_t count = 0;
  castmesh_error_v1 error{};
  ASSERT_EQ(rdma_engine_query_devices(fake::ops(), devices.data(), 4, &count, &error), CASTMESH_STATUS_OK);
  ASSERT_EQ(count, 2u);
  EXPECT_STREQ(devices[1].name, "fake_b");
  EXPECT_EQ(devices[1].kind, CASTMESH_DEVICE_KIND_RDMA_NIC);
  EXPECT_EQ(devices[1].memory_bytes, uint64_t{1} << 40);
  EXPECT_THAT(devices[1].detail, HasSubstr("fw=fake-1.0"));
}

TEST_F(FakeVerbs, QueryWithoutDevicesSaysNoDeviceOrNoDriver) {
  castmesh_device_info_v1 device{};
  device.struct_size = sizeof device;
  uint32_t count = 7;
  castmesh_error_v1 error{};
  fake::fail_next(fake::Call::kGetDeviceList, ENOSYS);
  EXPECT_EQ(rdma_engine_query_devices(fake::ops(), &device, 1, &count, &error), CASTMESH_STATUS_NO_DEVICE);
  EXPECT_EQ(count, 0u);
  EXPECT_THAT(error.message, HasSubstr("no RDMA device"));
  fake::fail_next(fake::Call::kGetDeviceList, 0);
  EXPECT_EQ(rdma_engine_query_devices(fake::ops(), &device, 1, &count, &error), CASTMESH_STATUS_NO_DEVICE);
  fake::fail_next(fake::Call::kGetDeviceList, EACCES);
  EXPECT_EQ(rdma_engine_query_devices(fake::ops(), &device, 1, &count, &error), CASTMESH_STATUS_NO_DRIVER);
  EXPECT_THAT(error.message, HasSubstr("ibv_get_device_list failed"));
}

TEST_F(FakeVerbs, OpenWithoutANamePicksTheFirstActivePort) {
  fake::DeviceSpec down = nic("fake_down", 3);
  down.port_state = IBV_PORT_DOWN;
  fake::reset({down, nic("fake_up", 4)});
  castmesh_rdma_device_v1* device = open(nullptr);
  ASSERT_NE(device, nullptr);
  Endpoint endpoint = create(device);
  EXPECT_EQ(endpoint.blob[8] << 8 | endpoint.blob[9], 4) << "the blob carries fake_up's LID";
}

TEST_F(FakeVerbs, OpenNamesTheProblem) {
  castmesh_rdma_device_v1* device = nullptr;
  castmesh_error_v1 error{};
  EXPECT_EQ(rdma_engine_open_device(fake::ops(), "mlx5_9", 1, 0, &device, &error), CASTMESH_STATUS_NO_DEVICE);
  EXPECT_THAT(error.message, HasSubstr("no RDMA device named 'mlx5_9' (found: fake_a, fake_b)"));
  EXPECT_EQ(device, nullptr);

  fake::fail_next(fake::Call::kOpenDevice, EACCES);
  EXPECT_EQ(rdma_engine_open_device(fake::ops(), "fake_a", 1, 0, &device, &error), CASTMESH_STATUS_NO_DEVICE);
  EXPECT_THAT(error.message, HasSubstr("ibv_open_device(fake_a) failed: Permission denied"));

  EXPECT_EQ(rdma_engine_open_device(fake::ops(), "fake_a", 2, 0, &device, &error),
            CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("port 2"));

  EXPECT_EQ(rdma_engine_open_device(fake::ops(), "fake_a", 1, 9, &device, &error),
            CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("GID index 9"));

  fake::fail_next(fake::Call::kAllocPd, ENOMEM);
  EXPECT_EQ(rdma_engine_open_device(fake::ops(), "fake_a", 1, 0, &device, &error),
            CASTMESH_STATUS_RESOURCE_EXHAUSTED);
  EXPECT_THAT(error.message, HasSubstr("ibv_alloc_pd(fake_a)"));

  fake::DeviceSpec down = nic("fake_down", 3);
  down.port_state = IBV_PORT_INIT;
  fake::reset({down});
  EXPECT_EQ(rdma_engine_open_device(fake::ops(), "fake_down", 1, 0, &device, &error), CASTMESH_STATUS_NO_DEVICE);
  EXPECT_THAT(error.message, HasSubstr("port 1 of RDMA device fake_down is INIT (no subnet manager?)"));
  EXPECT_EQ(rdma_engine_open_device(fake::ops(), nullptr, 1, 0, &device, &error), CASTMESH_STATUS_NO_DEVICE);
  EXPECT_THAT(error.message, HasSubstr("no RDMA device has port 1 ACTIVE (found: fake_down; last: port 1 of RDMA "
                                      "device fake_down is INIT"));
  // TearDown checks that every failed open released what it had opened.
}

// ---- memory registration cache ----

TEST_F(FakeVerbs, RegistrationCacheReturnsTheCoveringRegistrationWithARefcount) {
  SetUpDevices();
  std::vector<char> buffer(4096);
  const castmesh_rdma_mr_info_v1 whole = reg(a_, buffer.data(), buffer.size(), kAllAccess);
  EXPECT_EQ(whole.refs, 1u);
  EXPECT_EQ(whole.addr, addr_of(buffer.data()));
  EXPECT_EQ(whole.length, 4096u);
  EXPECT_EQ(fake::live().mrs, 1);

  // A sub-range with less access hits the cache.
  const castmesh_rdma_mr_info_v1 part = reg(a_, buffer.data() + 100, 200, CASTMESH_RDMA_ACCESS_REMOTE_READ);
  EXPECT_EQ(part.handle, whole.handle);
  EXPECT_EQ(part.lkey, whole.lkey);
  EXPECT_EQ(part.rkey, whole.rkey);
  EXPECT_EQ(part.addr, whole.addr);
  EXPECT_EQ(part.length, whole.length);
  EXPECT_EQ(part.refs, 2u);
  EXPECT_EQ(fake::live().mrs, 1);

  // A range sticking out is a new registration.
  const castmesh_rdma_mr_info_v1 beyond = reg(a_, buffer.data() + 4000, 200 - 104, kAllAccess);
  EXPECT_EQ(beyond.handle, whole.handle) << "[4000, 4096) is still inside";
  std::vector<char> other(64);
  const castmesh_rdma_mr_info_v1 elsewhere = reg(a_, other.data(), other.size(), kAllAccess);
  EXPECT_NE(elsewhere.handle, whole.handle);
  EXPECT_EQ(elsewhere.refs, 1u);
  EXPECT_EQ(fake::live().mrs, 2);

  castmesh_error_v1 error{};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rdma_engine_deregister_memory(a_, whole.handle, &error), CASTMESH_STATUS_OK) << error.message;
    EXPECT_EQ(fake::live().mrs, i < 2 ? 2 : 1) << "the last reference deregisters";
  }
  EXPECT_EQ(rdma_engine_deregister_memory(a_, whole.handle, &error), CASTMESH_STATUS_FAILED_PRECONDITION);
  EXPECT_THAT(error.message, HasSubstr("is not live on fake_a (deregistered already"));
  EXPECT_EQ(rdma_engine_deregister_memory(a_, elsewhere.handle, &error), CASTMESH_STATUS_OK);

  // Handles are never reused: a new registration of the same range is another one.
  const castmesh_rdma_mr_info_v1 again = reg(a_, buffer.data(), buffer.size(), kAllAccess);
  EXPECT_NE(again.handle, whole.handle);
  EXPECT_EQ(rdma_engine_deregister_memory(a_, whole.handle, &error), CASTMESH_STATUS_FAILED_PRECONDITION);
  EXPECT_EQ(rdma_engine_deregister_memory(a_, again.handle, &error), CASTMESH_STATUS_OK);
}

TEST_F(FakeVerbs, MoreAccessThanTheCachedRegistrationGrantsIsANewRegistration) {
  SetUpDevices();
  std::vector<char> buffer(1024);
  const castmesh_rdma_mr_info_v1 read_only = reg(a_, buffer.data(), buffer.size(), CASTMESH_RDMA_ACCESS_REMOTE_READ);
  EXPECT_EQ(read_only.access, static_cast<uint32_t>(CASTMESH_RDMA_ACCESS_REMOTE_READ));
  const castmesh_rdma_mr_info_v1 writable =
      reg(a_, buffer.data(), buffer.size(), CASTMESH_RDMA_ACCESS_REMOTE_WRITE);
  EXPECT_NE(writable.handle, read_only.handle);
  // Remote write needs local write in the verbs; the backend adds it.
  EXPECT_EQ(writable.access, static_cast<uint32_t>(CASTMESH_RDMA_ACCESS_REMOTE_WRITE |
                                                   CASTMESH_RDMA_ACCESS_LOCAL_WRITE));
  EXPECT_EQ(fake::live().mrs, 2);
}

TEST_F(FakeVerbs, RegistrationErrorsAreClear) {
  SetUpDevices();
  std::vector<char> buffer(64);
  castmesh_rdma_mr_info_v1 info = empty_info();
  castmesh_error_v1 error{};
  fake::fail_next(fake::Call::kRegMr, ENOMEM);
  EXPECT_EQ(rdma_engine_register_memory(a_, buffer.data(), 64, kAllAccess, &info, &error),
            CASTMESH_STATUS_RESOURCE_EXHAUSTED);
  EXPECT_THAT(error.message, HasSubstr("ulimit -l"));
  fake::fail_next(fake::Call::kRegMr, EFAULT);
  EXPECT_EQ(rdma_engine_register_memory(a_, buffer.data(), 64, kAllAccess, &info, &error),
            CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(rdma_engine_register_memory(a_, nullptr, 64, kAllAccess, &info, &error),
            CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(rdma_engine_register_memory(a_, buffer.data(), 0, kAllAccess, &info, &error),
            CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(rdma_engine_register_memory(a_, buffer.data(), UINT64_MAX, kAllAccess, &info, &error),
            CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(rdma_engine_register_memory(a_, buffer.data(), 64, 0x10, &info, &error),
            CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("unknown access bits 0x10"));
  info.struct_size = 8;
  EXPECT_EQ(rdma_engine_register_memory(a_, buffer.data(), 64, kAllAccess, &info, &error),
            CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(fake::live().mrs, 0);
}

// ---- endpoints: blob and connection state machine ----

TEST_F(FakeVerbs, BlobIsBigEndianWithMagicVersionAndTheQpFacts) {
  SetUpDevices();
  Endpoint a = create(a_);
  const uint8_t* blob = a.blob;
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(blob), 4), "CMRC");
  EXPECT_EQ(blob[4] << 8 | blob[5], 1);
  EXPECT_EQ(blob[6], IBV_MTU_4096);
  EXPECT_EQ(blob[7], 1) << "InfiniBand";
  EXPECT_EQ(blob[8] << 8 | blob[9], 1) << "fake_a's LID";
  const uint32_t qp_num = uint32_t{blob[12]} << 24 | uint32_t{blob[13]} << 16 | uint32_t{blob[14]} << 8 | blob[15];
  const uint32_t psn = uint32_t{blob[16]} << 24 | uint32_t{blob[17]} << 16 | uint32_t{blob[18]} << 8 | blob[19];
  EXPECT_TRUE(fake::qp(qp_num).exists);
  EXPECT_LT(psn, 1u << 24);
  EXPECT_EQ(blob[20], 0xfe);
  EXPECT_EQ(blob[35], 1) << "fake_a's GID";

  // The peer's QP is configured with exactly these facts.
  Endpoint b = create(b_);
  castmesh_error_v1 error{};
  ASSERT_EQ(connect(b, a, &error), CASTMESH_STATUS_OK) << error.message;
  const uint32_t b_qp = uint32_t{b.blob[12]} << 24 | uint32_t{b.blob[13]} << 16 | uint32_t{b.blob[14]} << 8 |
                        b.blob[15];
  const fake::QpSnapshot snap = fake::qp(b_qp);
  EXPECT_EQ(snap.dest_qp_num, qp_num);
  EXPECT_EQ(snap.rq_psn, psn);
  EXPECT_EQ(snap.dlid, 1);
}

TEST_F(FakeVerbs, ConnectWalksInitRtrRtsWithSaneDefaults) {
  SetUpDevices();
  [[maybe_unused]] auto [a, b] = connected_pair(32);
  const uint32_t a_qp = uint32_t{a.blob[13]} << 16 | uint32_t{a.blob[14]} << 8 | a.blob[15];
  const fake::QpSnapshot snap = fake::qp(a_qp);
  EXPECT_EQ(snap.state, IBV_QPS_RTS);
  EXPECT_FALSE(snap.sq_sig_all) << "selective signalling";
  EXPECT_EQ(snap.max_send_wr, 32);
  EXPECT_EQ(snap.path_mtu, IBV_MTU_4096);
  EXPECT_EQ(snap.dlid, 2);
  EXPECT_FALSE(snap.is_global);
  EXPECT_EQ(snap.timeout, 14);
  EXPECT_EQ(snap.retry_cnt, 7);
  EXPECT_EQ(snap.rnr_retry, 7);
  EXPECT_EQ(snap.max_rd_atomic, 16) << "from the device attributes";
  EXPECT_EQ(snap.max_dest_rd_atomic, 16);
  EXPECT_EQ(snap.access_flags, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);

  castmesh_error_v1 error{};
  EXPECT_EQ(connect(a, b, &error), CASTMESH_STATUS_FAILED_PRECONDITION);
  EXPECT_THAT(error.message, HasSubstr("already connected"));
}

TEST_F(FakeVerbs, PathMtuIsTheSmallerOfBothSides) {
  fake::DeviceSpec small = nic("fake_small", 5);
  small.mtu = IBV_MTU_1024;
  fake::reset({nic("fake_a", 1), small});
  a_ = open("fake_a");
  b_ = open("fake_small");
  [[maybe_unused]] auto [a, b] = connected_pair();
  const uint32_t a_qp = uint32_t{a.blob[13]} << 16 | uint32_t{a.blob[14]} << 8 | a.blob[15];
  EXPECT_EQ(fake::qp(a_qp).path_mtu, IBV_MTU_1024);
}

TEST_F(FakeVerbs, RoceEndpointsAddressThePeerByGid) {
  fake::DeviceSpec x = nic("fake_roce_x", 0);
  fake::DeviceSpec y = nic("fake_roce_y", 0);
  x.link_layer = y.link_layer = IBV_LINK_LAYER_ETHERNET;
  fake::reset({x, y, nic("fake_ib", 9)});
  a_ = open("fake_roce_x");
  b_ = open("fake_roce_y");
  [[maybe_unused]] auto [a, b] = connected_pair();
  EXPECT_EQ(a.blob[7], 2) << "Ethernet";
  const uint32_t a_qp = uint32_t{a.blob[13]} << 16 | uint32_t{a.blob[14]} << 8 | a.blob[15];
  EXPECT_TRUE(fake::qp(a_qp).is_global);

  std::vector<char> src(16, 'r');
  std::vector<char> dst(16, 0);
  const castmesh_rdma_mr_info_v1 local = reg(a_, src.data(), src.size(), kAllAccess);
  const castmesh_rdma_mr_info_v1 remote = reg(b_, dst.data(), dst.size(), kAllAccess);
  castmesh_error_v1 error{};
  ASSERT_EQ(post(a, {op(CASTMESH_RDMA_OP_WRITE, 1, src.data(), local.lkey, dst.data(), remote.rkey, 16)}, &error),
            CASTMESH_STATUS_OK)
      << error.message;
  ASSERT_EQ(poll(a).size(), 1u);
  EXPECT_EQ(dst, src);

  // An InfiniBand port cannot connect to a RoCE one.
  castmesh_rdma_device_v1* ib = open("fake_ib");
  Endpoint c = create(ib);
  EXPECT_EQ(connect(c, b, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("the peer's port is Ethernet (RoCE), this one (fake_ib) is InfiniBand"));
}

TEST_F(FakeVerbs, MalformedBlobsAreRejectedAndTheEndpointStaysUsable) {
  SetUpDevices();
  Endpoint a = create(a_);
  Endpoint b = create(b_);
  castmesh_error_v1 error{};
  EXPECT_EQ(rdma_engine_connect_endpoint(a_, a.handle, nullptr, 36, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(rdma_engine_connect_endpoint(a_, a.handle, b.blob, 0, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(rdma_engine_connect_endpoint(a_, a.handle, b.blob, 35, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("is 35 bytes, needs 36 (truncated message?)"));

  struct Case {
    size_t offset;
    uint8_t value;
    const char* says;
  };
  const Case cases[] = {
      {0, 'X', "bad magic"},       {5, 2, "has version 2"},          {6, 0, "MTU code 0"},
      {6, 9, "MTU code 9"},        {7, 3, "link layer 3"},           {12, 1, "not a 24-bit value"},
      {16, 1, "not a 24-bit value"}, {7, 2, "the peer's port is Ethernet"},
  };
  for (const Case& c : cases) {
    uint8_t blob[CASTMESH_RDMA_ENDPOINT_BLOB_SIZE];
    std::memcpy(blob, b.blob, sizeof blob);
    blob[c.offset] = c.value;
    EXPECT_EQ(rdma_engine_connect_endpoint(a_, a.handle, blob, sizeof blob, &error),
              CASTMESH_STATUS_INVALID_ARGUMENT)
        << c.says;
    EXPECT_THAT(error.message, HasSubstr(c.says));
  }
  uint8_t zero_qp[CASTMESH_RDMA_ENDPOINT_BLOB_SIZE];
  std::memcpy(zero_qp, b.blob, sizeof zero_qp);
  std::memset(zero_qp + 12, 0, 4);
  EXPECT_EQ(rdma_engine_connect_endpoint(a_, a.handle, zero_qp, sizeof zero_qp, &error),
            CASTMESH_STATUS_INVALID_ARGUMENT);
  uint8_t no_lid[CASTMESH_RDMA_ENDPOINT_BLOB_SIZE];
  std::memcpy(no_lid, b.blob, sizeof no_lid);
  no_lid[8] = no_lid[9] = 0;
  EXPECT_EQ(rdma_engine_connect_endpoint(a_, a.handle, no_lid, sizeof no_lid, &error),
            CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("subnet manager"));

  // Random garbage never crashes and never connects by accident.
  std::mt19937 random(13);
  for (int i = 0; i < 500; ++i) {
    uint8_t garbage[48];
    for (uint8_t& byte : garbage) byte = static_cast<uint8_t>(random());
    const size_t size = random() % sizeof garbage;
    EXPECT_EQ(rdma_engine_connect_endpoint(a_, a.handle, garbage, size, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  }

  // The endpoint was left in RESET: the real blob still connects it.
  EXPECT_EQ(connect(a, b, &error), CASTMESH_STATUS_OK) << error.message;
}

TEST_F(FakeVerbs, AFailedTransitionFailsTheEndpointAndSaysWhere) {
  SetUpDevices();
  const std::pair<fake::Call, const char*> steps[] = {{fake::Call::kModifyQpToInit, "RESET->INIT"},
                                                      {fake::Call::kModifyQpToRtr, "INIT->RTR"},
                                                      {fake::Call::kModifyQpToRts, "RTR->RTS"}};
  for (const auto& [call, step] : steps) {
    Endpoint a = create(a_);
    Endpoint b = create(b_);
    castmesh_error_v1 error{};
    fake::fail_next(call, EINVAL);
    EXPECT_EQ(connect(a, b, &error), CASTMESH_STATUS_INTERNAL);
    EXPECT_THAT(error.message, HasSubstr(std::string(step) + " failed: ibv_modify_qp: Invalid argument"));
    EXPECT_EQ(connect(a, b, &error), CASTMESH_STATUS_FAILED_PRECONDITION);
    EXPECT_THAT(error.message, HasSubstr("has failed (connecting failed at " + std::string(step)));
    std::vector<char> buffer(8);
    const castmesh_rdma_mr_info_v1 mr = reg(a_, buffer.data(), 8, kAllAccess);
    EXPECT_EQ(post(a, {op(CASTMESH_RDMA_OP_WRITE, 1, buffer.data(), mr.lkey, buffer.data(), mr.rkey, 8)}, &error),
              CASTMESH_STATUS_FAILED_PRECONDITION);
    EXPECT_THAT(error.message, HasSubstr("destroy it and connect a new one"));
    EXPECT_EQ(rdma_engine_destroy_endpoint(a_, a.handle, &error), CASTMESH_STATUS_OK);
    EXPECT_EQ(rdma_engine_destroy_endpoint(b_, b.handle, &error), CASTMESH_STATUS_OK);
    EXPECT_EQ(rdma_engine_deregister_memory(a_, mr.handle, &error), CASTMESH_STATUS_OK);
  }
  EXPECT_EQ(fake::live().qps, 0);
}

TEST_F(FakeVerbs, EndpointCreationErrorsAreClearAndLeakNothing) {
  SetUpDevices();
  uint64_t handle = 0;
  uint8_t blob[CASTMESH_RDMA_ENDPOINT_BLOB_SIZE];
  castmesh_error_v1 error{};
  EXPECT_EQ(rdma_engine_create_endpoint(a_, 100000, &handle, blob, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("exceeds fake_a's limits (max_qp_wr 256"));
  fake::fail_next(fake::Call::kCreateCq, ENOMEM);
  EXPECT_EQ(rdma_engine_create_endpoint(a_, 0, &handle, blob, &error), CASTMESH_STATUS_RESOURCE_EXHAUSTED);
  EXPECT_THAT(error.message, HasSubstr("ibv_create_cq"));
  fake::fail_next(fake::Call::kCreateQp, EPERM);
  EXPECT_EQ(rdma_engine_create_endpoint(a_, 0, &handle, blob, &error), CASTMESH_STATUS_INTERNAL);
  EXPECT_THAT(error.message, HasSubstr("ibv_create_qp(fake_a, RC, 128 send slots) failed"));
  EXPECT_EQ(fake::live().cqs, 0);
  EXPECT_EQ(fake::live().qps, 0);
}

TEST_F(FakeVerbs, DoubleDestroyAndStaleHandlesAreClearErrors) {
  SetUpDevices();
  [[maybe_unused]] auto [a, b] = connected_pair();
  castmesh_error_v1 error{};
  EXPECT_EQ(rdma_engine_destroy_endpoint(a_, a.handle, &error), CASTMESH_STATUS_OK);
  EXPECT_EQ(rdma_engine_destroy_endpoint(a_, a.handle, &error), CASTMESH_STATUS_FAILED_PRECONDITION);
  EXPECT_THAT(error.message, HasSubstr("destroy_endpoint: endpoint"));
  EXPECT_THAT(error.message, HasSubstr("destroyed already"));
  EXPECT_EQ(connect(a, b, &error), CASTMESH_STATUS_FAILED_PRECONDITION);
  EXPECT_EQ(post(a, {}, &error), CASTMESH_STATUS_FAILED_PRECONDITION);
  castmesh_rdma_completion_v1 completion{};
  uint32_t count = 0;
  EXPECT_EQ(rdma_engine_poll(a_, a.handle, &completion, 1, &count, &error), CASTMESH_STATUS_FAILED_PRECONDITION);
  // A handle of another device is not live here either.
  EXPECT_EQ(rdma_engine_destroy_endpoint(a_, b.handle, &error), CASTMESH_STATUS_FAILED_PRECONDITION);
  // A new endpoint never gets the old handle.
  Endpoint c = create(a_);
  EXPECT_NE(c.handle, a.handle);
}

// ---- moving bytes ----

TEST_F(FakeVerbs, WriteAndReadMoveRealBytes) {
  SetUpDevices();
  [[maybe_unused]] auto [a, b] = connected_pair();
  std::vector<uint8_t> local(256);
  std::vector<uint8_t> remote(256);
  for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<uint8_t>(i);
  const castmesh_rdma_mr_info_v1 lmr = reg(a_, local.data(), local.size(), kAllAccess);
  const castmesh_rdma_mr_info_v1 rmr = reg(b_, remote.data(), remote.size(), kAllAccess);
  castmesh_error_v1 error{};

  // WRITE bytes [10, 110) of local to [50, 150) of remote.
  ASSERT_EQ(post(a, {op(CASTMESH_RDMA_OP_WRITE, 7, local.data() + 10, lmr.lkey, remote.data() + 50, rmr.rkey, 100)},
                 &error),
            CASTMESH_STATUS_OK)
      << error.message;
  std::vector<castmesh_rdma_completion_v1> done = poll(a);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].wr_id, 7u);
  EXPECT_EQ(done[0].status, CASTMESH_STATUS_OK);
  EXPECT_EQ(done[0].opcode, static_cast<uint32_t>(CASTMESH_RDMA_OP_WRITE));
  EXPECT_STREQ(done[0].message, "ok");
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(remote[50 + i], local[10 + i]) << i;
  EXPECT_EQ(remote[49], 0);
  EXPECT_EQ(remote[150], 0);

  // READ them back from the other side into a fresh buffer.
  std::vector<uint8_t> back(100, 0xee);
  const castmesh_rdma_mr_info_v1 bmr = reg(b_, back.data(), back.size(), CASTMESH_RDMA_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(post(b, {op(CASTMESH_RDMA_OP_READ, 8, back.data(), bmr.lkey, local.data() + 10, lmr.rkey, 100)}, &error),
            CASTMESH_STATUS_OK)
      << error.message;
  done = poll(b);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CASTMESH_STATUS_OK);
  EXPECT_EQ(done[0].opcode, static_cast<uint32_t>(CASTMESH_RDMA_OP_READ));
  EXPECT_TRUE(std::equal(back.begin(), back.end(), local.begin() + 10));
}

TEST_F(FakeVerbs, AListCompletesWithOneCompletionUnlessOpsAskForMore) {
  SetUpDevices();
  [[maybe_unused]] auto [a, b] = connected_pair(64);
  std::vector<uint8_t> local(1000, 3);
  std::vector<uint8_t> remote(1000, 0);
  const castmesh_rdma_mr_info_v1 lmr = reg(a_, local.data(), local.size(), kAllAccess);
  const castmesh_rdma_mr_info_v1 rmr = reg(b_, remote.data(), remote.size(), kAllAccess);
  std::vector<castmesh_rdma_op_v1> ops;
  for (uint64_t i = 0; i < 10; ++i) {
    ops.push_back(op(CASTMESH_RDMA_OP_WRITE, 100 + i, local.data() + i * 100, lmr.lkey, remote.data() + i * 100,
                     rmr.rkey, 100));
  }
  castmesh_error_v1 error{};
  uint32_t posted = 0;
  ASSERT_EQ(post(a, ops, &error, &posted), CASTMESH_STATUS_OK) << error.message;
  EXPECT_EQ(posted, 10u);
  EXPECT_EQ(fake::executed_ops(), 10);
  EXPECT_EQ(rdma_engine_outstanding(a_, a.handle), 10);
  std::vector<castmesh_rdma_completion_v1> done = poll(a);
  ASSERT_EQ(done.size(), 1u) << "only the last op of a list is signalled";
  EXPECT_EQ(done[0].wr_id, 109u);
  EXPECT_EQ(rdma_engine_outstanding(a_, a.handle), 0) << "its completion retires the whole list";
  EXPECT_EQ(remote, local);

  ops[3].flags = CASTMESH_RDMA_OP_SIGNALED;
  ASSERT_EQ(post(a, ops, &error), CASTMESH_STATUS_OK) << error.message;
  done = poll(a);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].wr_id, 103u);
  EXPECT_EQ(done[1].wr_id, 109u);

  // Capacity 1: the second completion waits for the next poll; nothing is lost.
  ASSERT_EQ(post(a, ops, &error), CASTMESH_STATUS_OK) << error.message;
  EXPECT_EQ(poll(a, 1).size(), 1u);
  EXPECT_EQ(rdma_engine_outstanding(a_, a.handle), 6);
  done = poll(a, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].wr_id, 109u);
  EXPECT_EQ(rdma_engine_outstanding(a_, a.handle), 0);
  EXPECT_TRUE(poll(a).empty());
}

TEST_F(FakeVerbs, AFullSendQueueRefusesTheWholeListUntilCompletionsArePolled) {
  SetUpDevices();
  [[maybe_unused]] auto [a, b] = connected_pair(8);
  std::vector<uint8_t> local(64, 1);
  std::vector<uint8_t> remote(64, 0);
  const castmesh_rdma_mr_info_v1 lmr = reg(a_, local.data(), local.size(), kAllAccess);
  const castmesh_rdma_mr_info_v1 rmr = reg(b_, remote.data(), remote.size(), kAllAccess);
  const castmesh_rdma_op_v1 write = op(CASTMESH_RDMA_OP_WRITE, 1, local.data(), lmr.lkey, remote.data(), rmr.rkey, 8);
  castmesh_error_v1 error{};
  // Three lists of two: six slots, retired only when their completions are polled.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(post(a, {write, write}, &error), CASTMESH_STATUS_OK) << error.message;
  EXPECT_EQ(rdma_engine_outstanding(a_, a.handle), 6);
  uint32_t posted = 99;
  EXPECT_EQ(post(a, {write, write, write}, &error, &posted), CASTMESH_STATUS_RESOURCE_EXHAUSTED);
  EXPECT_EQ(posted, 0u);
  EXPECT_THAT(error.message, HasSubstr("send queue full: 6 of 8 slots in use, 3 more asked for"));
  EXPECT_EQ(fake::executed_ops(), 6) << "nothing of the refused list was posted";
  EXPECT_EQ(post(a, {write, write}, &error), CASTMESH_STATUS_OK) << "two still fit";
  EXPECT_EQ(post(a, {write}, &error), CASTMESH_STATUS_RESOURCE_EXHAUSTED);
  EXPECT_EQ(poll(a).size(), 4u);
  EXPECT_EQ(post(a, {write, write, write}, &error), CASTMESH_STATUS_OK) << error.message;

  // A list longer than the queue can never fit.
  const std::vector<castmesh_rdma_op_v1> nine(9, write);
  EXPECT_EQ(post(a, nine, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("9 ops can never fit the endpoint's send queue of 8"));

  // The NIC itself saying "full" (ENOMEM) is RESOURCE_EXHAUSTED too, and harmless.
  EXPECT_EQ(poll(a).size(), 1u);
  fake::fail_next(fake::Call::kPostSend, ENOMEM);
  EXPECT_EQ(post(a, {write}, &error, &posted), CASTMESH_STATUS_RESOURCE_EXHAUSTED);
  EXPECT_EQ(posted, 0u);
  EXPECT_THAT(error.message, HasSubstr("send queue is full"));
  EXPECT_EQ(post(a, {write}, &error), CASTMESH_STATUS_OK) << error.message;
  EXPECT_EQ(poll(a).size(), 1u);
}

TEST_F(FakeVerbs, AListTheNicTakesOnlyPartlyFailsTheEndpoint) {
  SetUpDevices();
  auto [a, b] = connected_pair(16);
  std::vector<uint8_t> local(64, 5);
  std::vector<uint8_t> remote(64, 0);
  const castmesh_rdma_mr_info_v1 lmr = reg(a_, local.data(), local.size(), kAllAccess);
  const castmesh_rdma_mr_info_v1 rmr = reg(b_, remote.data(), remote.size(), kAllAccess);
  const castmesh_rdma_op_v1 write = op(CASTMESH_RDMA_OP_WRITE, 1, local.data(), lmr.lkey, remote.data(), rmr.rkey, 8);
  castmesh_error_v1 error{};
  uint32_t posted = 0;
  fake::fail_next_post_at(2, EINVAL);
  EXPECT_EQ(post(a, {write, write, write, write}, &error, &posted), CASTMESH_STATUS_INTERNAL);
  EXPECT_EQ(posted, 2u);
  EXPECT_THAT(error.message, HasSubstr("took 2 of 4 ops, then failed: Invalid argument; the endpoint has failed"));
  EXPECT_EQ(post(a, {write}, &error), CASTMESH_STATUS_FAILED_PRECONDITION);
  EXPECT_THAT(error.message, HasSubstr("ibv_post_send refused op 2 of a list"));

  // Refused at the first op: nothing went out and the endpoint is fine.
  fake::fail_next_post_at(0, EINVAL);
  EXPECT_EQ(post(b, {write}, &error, &posted), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(posted, 0u);
  EXPECT_EQ(rdma_engine_outstanding(b_, b.handle), 0);
}

TEST_F(FakeVerbs, BadOpsAreRefusedBeforeAnythingIsPosted) {
  SetUpDevices();
  [[maybe_unused]] auto [a, b] = connected_pair();
  std::vector<uint8_t> buffer(64);
  const castmesh_rdma_mr_info_v1 mr = reg(a_, buffer.data(), buffer.size(), kAllAccess);
  castmesh_rdma_op_v1 bad = op(7, 1, buffer.data(), mr.lkey, buffer.data(), mr.rkey, 8);
  castmesh_error_v1 error{};
  EXPECT_EQ(post(a, {bad}, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("opcode 7"));
  bad.opcode = CASTMESH_RDMA_OP_READ;
  bad.flags = 0x80;
  EXPECT_EQ(post(a, {bad}, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  bad.flags = 0;
  bad.length = uint64_t{1} << 31;
  EXPECT_EQ(post(a, {bad}, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("split it"));
  EXPECT_EQ(fake::executed_ops(), 0);

  Endpoint c = create(a_);
  EXPECT_EQ(post(c, {op(CASTMESH_RDMA_OP_READ, 1, buffer.data(), mr.lkey, buffer.data(), mr.rkey, 8)}, &error),
            CASTMESH_STATUS_FAILED_PRECONDITION);
  EXPECT_THAT(error.message, HasSubstr("not connected yet"));
}

// ---- completion errors ----

TEST_F(FakeVerbs, RemoteAccessErrorsFlushTheRestAndFailTheEndpoint) {
  SetUpDevices();
  [[maybe_unused]] auto [a, b] = connected_pair();
  std::vector<uint8_t> local(64, 9);
  std::vector<uint8_t> remote(64, 0);
  const castmesh_rdma_mr_info_v1 lmr = reg(a_, local.data(), local.size(), kAllAccess);
  const castmesh_rdma_mr_info_v1 rmr = reg(b_, remote.data(), remote.size(), CASTMESH_RDMA_ACCESS_REMOTE_READ);
  castmesh_error_v1 error{};
  // WRITE into a range the owner registered for READ only, then two more ops.
  ASSERT_EQ(post(a,
                 {op(CASTMESH_RDMA_OP_WRITE, 1, local.data(), lmr.lkey, remote.data(), rmr.rkey, 8),
                  op(CASTMESH_RDMA_OP_READ, 2, local.data(), lmr.lkey, remote.data(), rmr.rkey, 8),
                  op(CASTMESH_RDMA_OP_READ, 3, local.data(), lmr.lkey, remote.data(), rmr.rkey, 8)},
                 &error),
            CASTMESH_STATUS_OK)
      << error.message;
  const std::vector<castmesh_rdma_completion_v1> done = poll(a);
  ASSERT_EQ(done.size(), 3u) << "a failed op completes even unsignalled, and the rest are flushed";
  EXPECT_EQ(done[0].wr_id, 1u);
  EXPECT_EQ(done[0].status, CASTMESH_STATUS_PERMISSION_DENIED);
  EXPECT_EQ(done[0].wc_status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_THAT(done[0].message,
              HasSubstr("remote access error: the rkey/range is not registered for this access on the owner"));
  EXPECT_EQ(done[1].status, CASTMESH_STATUS_ABORTED);
  EXPECT_EQ(done[2].status, CASTMESH_STATUS_ABORTED);
  EXPECT_THAT(done[2].message, HasSubstr("flushed"));
  EXPECT_EQ(remote, std::vector<uint8_t>(64, 0)) << "no byte was written";

  EXPECT_EQ(post(a, {op(CASTMESH_RDMA_OP_READ, 4, local.data(), lmr.lkey, remote.data(), rmr.rkey, 8)}, &error),
            CASTMESH_STATUS_FAILED_PRECONDITION);
  EXPECT_THAT(error.message, HasSubstr("op 1: remote access error"));
}

TEST_F(FakeVerbs, KeyAndRangeMistakesGetTheNicsErrors) {
  SetUpDevices();
  std::vector<uint8_t> local(64, 9);
  std::vector<uint8_t> remote(64, 0);
  const castmesh_rdma_mr_info_v1 lmr = reg(a_, local.data(), local.size(), kAllAccess);
  const castmesh_rdma_mr_info_v1 rmr = reg(b_, remote.data(), remote.size(), kAllAccess);
  struct Case {
    castmesh_rdma_op_v1 op;
    int32_t status;
    const char* says;
  };
  const Case cases[] = {
      {op(CASTMESH_RDMA_OP_WRITE, 1, local.data(), lmr.lkey, remote.data() + 60, rmr.rkey, 8),
       CASTMESH_STATUS_PERMISSION_DENIED, "remote access error"},
      {op(CASTMESH_RDMA_OP_WRITE, 1, local.data(), lmr.lkey, remote.data(), rmr.rkey + 1, 8),
       CASTMESH_STATUS_PERMISSION_DENIED, "remote access error"},
      {op(CASTMESH_RDMA_OP_WRITE, 1, local.data(), lmr.rkey, remote.data(), rmr.rkey, 8),
       CASTMESH_STATUS_INVALID_ARGUMENT, "local protection error"},
      {op(CASTMESH_RDMA_OP_READ, 1, local.data() + 60, lmr.lkey, remote.data(), rmr.rkey, 8),
       CASTMESH_STATUS_INVALID_ARGUMENT, "local protection error"},
  };
  for (const Case& c : cases) {
    [[maybe_unused]] auto [a, b] = connected_pair();
    castmesh_error_v1 error{};
    ASSERT_EQ(post(a, {c.op}, &error), CASTMESH_STATUS_OK) << error.message;
    const std::vector<castmesh_rdma_completion_v1> done = poll(a);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, c.status) << done[0].message;
    EXPECT_THAT(done[0].message, HasSubstr(c.says));
  }
  EXPECT_EQ(remote, std::vector<uint8_t>(64, 0));
}

TEST_F(FakeVerbs, APeerThatIsGoneIsUnavailable) {
  SetUpDevices();
  [[maybe_unused]] auto [a, b] = connected_pair();
  std::vector<uint8_t> local(8);
  const castmesh_rdma_mr_info_v1 lmr = reg(a_, local.data(), local.size(), kAllAccess);
  castmesh_error_v1 error{};
  ASSERT_EQ(rdma_engine_destroy_endpoint(b_, b.handle, &error), CASTMESH_STATUS_OK);
  ASSERT_EQ(post(a, {op(CASTMESH_RDMA_OP_READ, 5, local.data(), lmr.lkey, local.data(), 1, 8)}, &error),
            CASTMESH_STATUS_OK);
  const std::vector<castmesh_rdma_completion_v1> done = poll(a);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CASTMESH_STATUS_UNAVAILABLE);
  EXPECT_THAT(done[0].message, HasSubstr("the peer did not answer"));
}

TEST_F(FakeVerbs, EveryCompletionErrorMapsToAStatusAndAMessage) {
  SetUpDevices();
  struct Expected {
    ibv_wc_status wc;
    int32_t status;
    const char* says;
  };
  const Expected table[] = {
      {IBV_WC_LOC_LEN_ERR, CASTMESH_STATUS_INVALID_ARGUMENT, "local length error"},
      {IBV_WC_LOC_QP_OP_ERR, CASTMESH_STATUS_INTERNAL, "local QP operation error"},
      {IBV_WC_LOC_EEC_OP_ERR, CASTMESH_STATUS_INTERNAL, "EE context"},
      {IBV_WC_LOC_PROT_ERR, CASTMESH_STATUS_INVALID_ARGUMENT, "local protection error"},
      {IBV_WC_WR_FLUSH_ERR, CASTMESH_STATUS_ABORTED, "flushed"},
      {IBV_WC_MW_BIND_ERR, CASTMESH_STATUS_INTERNAL, "memory window"},
      {IBV_WC_BAD_RESP_ERR, CASTMESH_STATUS_INTERNAL, "bad response"},
      {IBV_WC_LOC_ACCESS_ERR, CASTMESH_STATUS_INVALID_ARGUMENT, "local access error"},
      {IBV_WC_REM_INV_REQ_ERR, CASTMESH_STATUS_INVALID_ARGUMENT, "remote invalid request"},
      {IBV_WC_REM_ACCESS_ERR, CASTMESH_STATUS_PERMISSION_DENIED,
       "remote access error: the rkey/range is not registered for this access on the owner"},
      {IBV_WC_REM_OP_ERR, CASTMESH_STATUS_INTERNAL, "remote operation error"},
      {IBV_WC_RETRY_EXC_ERR, CASTMESH_STATUS_UNAVAILABLE, "transport retries exceeded"},
      {IBV_WC_RNR_RETRY_EXC_ERR, CASTMESH_STATUS_UNAVAILABLE, "receiver-not-ready"},
      {IBV_WC_LOC_RDD_VIOL_ERR, CASTMESH_STATUS_INTERNAL, "RDD violation"},
      {IBV_WC_REM_INV_RD_REQ_ERR, CASTMESH_STATUS_INTERNAL, "remote invalid RD request"},
      {IBV_WC_REM_ABORT_ERR, CASTMESH_STATUS_ABORTED, "remote abort"},
      {IBV_WC_INV_EECN_ERR, CASTMESH_STATUS_INTERNAL, "invalid EE context number"},
      {IBV_WC_INV_EEC_STATE_ERR, CASTMESH_STATUS_INTERNAL, "invalid EE context state"},
      {IBV_WC_FATAL_ERR, CASTMESH_STATUS_INTERNAL, "fatal NIC error"},
      {IBV_WC_RESP_TIMEOUT_ERR, CASTMESH_STATUS_UNAVAILABLE, "response timeout"},
      {IBV_WC_GENERAL_ERR, CASTMESH_STATUS_INTERNAL, "general error"},
      {IBV_WC_TM_ERR, CASTMESH_STATUS_INTERNAL, "tag matching error"},
      {IBV_WC_TM_RNDV_INCOMPLETE, CASTMESH_STATUS_INTERNAL, "rendezvous incomplete"},
  };
  // Every status verbs.h defines after SUCCESS is in the table.
  ASSERT_EQ(sizeof table / sizeof table[0], static_cast<size_t>(IBV_WC_TM_RNDV_INCOMPLETE));
  std::vector<uint8_t> local(8, 1);
  std::vector<uint8_t> remote(8, 0);
  const castmesh_rdma_mr_info_v1 lmr = reg(a_, local.data(), local.size(), kAllAccess);
  const castmesh_rdma_mr_info_v1 rmr = reg(b_, remote.data(), remote.size(), kAllAccess);
  for (const Expected& e : table) {
    SCOPED_TRACE(e.says);
    [[maybe_unused]] auto [a, b] = connected_pair();
    castmesh_error_v1 error{};
    fake::fail_next_op(e.wc);
    ASSERT_EQ(post(a, {op(CASTMESH_RDMA_OP_WRITE, 42, local.data(), lmr.lkey, remote.data(), rmr.rkey, 8)}, &error),
              CASTMESH_STATUS_OK);
    const std::vector<castmesh_rdma_completion_v1> done = poll(a);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].wr_id, 42u);
    EXPECT_EQ(done[0].status, e.status);
    EXPECT_EQ(done[0].wc_status, e.wc);
    EXPECT_EQ(done[0].vendor_err, 0x42u);
    EXPECT_THAT(done[0].message, HasSubstr(e.says));
    EXPECT_THAT(done[0].message, HasSubstr("ibv_wc_status " + std::to_string(e.wc)));
    const char* message = nullptr;
    EXPECT_EQ(rdma_engine_wc_status(e.wc, &message), e.status);
    EXPECT_THAT(message, HasSubstr(e.says));
    EXPECT_EQ(rdma_engine_destroy_endpoint(a_, a.handle, &error), CASTMESH_STATUS_OK);
    EXPECT_EQ(rdma_engine_destroy_endpoint(b_, b.handle, &error), CASTMESH_STATUS_OK);
  }
  EXPECT_EQ(remote, std::vector<uint8_t>(8, 0));
  const char* message = nullptr;
  EXPECT_EQ(rdma_engine_wc_status(IBV_WC_SUCCESS, &message), CASTMESH_STATUS_OK);
  EXPECT_EQ(rdma_engine_wc_status(999, &message), CASTMESH_STATUS_INTERNAL);
  EXPECT_THAT(message, HasSubstr("unknown completion status"));
}

// The device lock lets threads share a device (the TSan build checks it).
TEST_F(FakeVerbs, ThreadsMayShareADevice) {
  SetUpDevices();
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      castmesh_rdma_device_v1* devices[2] = {a_, b_};
      uint64_t handles[2] = {0, 0};
      uint8_t blobs[2][CASTMESH_RDMA_ENDPOINT_BLOB_SIZE];
      castmesh_error_v1 error{};
      for (int side = 0; side < 2; ++side) {
        failures[t] += rdma_engine_create_endpoint(devices[side], 8, &handles[side], blobs[side], &error) != 0;
      }
      failures[t] += rdma_engine_connect_endpoint(a_, handles[0], blobs[1], sizeof blobs[1], &error) != 0;
      failures[t] += rdma_engine_connect_endpoint(b_, handles[1], blobs[0], sizeof blobs[0], &error) != 0;
      std::vector<uint8_t> local(64, static_cast<uint8_t>(t));
      std::vector<uint8_t> remote(64, 0);
      castmesh_rdma_mr_info_v1 lmr = empty_info();
      castmesh_rdma_mr_info_v1 rmr = empty_info();
      failures[t] += rdma_engine_register_memory(a_, local.data(), 64, kAllAccess, &lmr, &error) != 0;
      failures[t] += rdma_engine_register_memory(b_, remote.data(), 64, kAllAccess, &rmr, &error) != 0;
      for (int round = 0; round < kRounds && failures[t] == 0; ++round) {
        const castmesh_rdma_op_v1 write =
            op(CASTMESH_RDMA_OP_WRITE, round, local.data(), lmr.lkey, remote.data(), rmr.rkey, 64);
        failures[t] += rdma_engine_post(a_, handles[0], &write, 1, nullptr, &error) != 0;
        castmesh_rdma_completion_v1 done{};
        uint32_t count = 0;
        failures[t] += rdma_engine_poll(a_, handles[0], &done, 1, &count, &error) != 0;
        failures[t] += count != 1 || done.status != CASTMESH_STATUS_OK;
      }
      failures[t] += remote != local;
      failures[t] += rdma_engine_deregister_memory(a_, lmr.handle, &error) != 0;
      failures[t] += rdma_engine_deregister_memory(b_, rmr.handle, &error) != 0;
      failures[t] += rdma_engine_destroy_endpoint(a_, handles[0], &error) != 0;
      failures[t] += rdma_engine_destroy_endpoint(b_, handles[1], &error) != 0;
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_EQ(fake::executed_ops(), kThreads * kRounds);
}

TEST_F(FakeVerbs, ClosingADeviceReleasesItsEndpointsAndRegistrations) {
  SetUpDevices();
  [[maybe_unused]] auto [a, b] = connected_pair();
  std::vector<uint8_t> buffer(64);
  reg(a_, buffer.data(), buffer.size(), kAllAccess);
  reg(a_, buffer.data(), 8, CASTMESH_RDMA_ACCESS_REMOTE_READ);
  create(a_);
  EXPECT_EQ(fake::live().qps, 3);
  rdma_engine_close_device(a_);
  rdma_engine_close_device(b_);
  devices_.clear();
  const fake::LiveObjects live = fake::live();
  EXPECT_EQ(live.contexts + live.pds + live.mrs + live.cqs + live.qps, 0);
  rdma_engine_close_device(nullptr);
}

}  // namespace
}  // namespace castmesh
