// The cross-process seam, exercised in one process: two runtimes with
// different proc ids joined by a fake router that (like a transport)
// carries only bytes.
#include <castmesh/castmesh.h>
#include <castmesh/detail/runtime_transport.h>
#include <google/protobuf/wrappers.pb.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "test_actors.h"

namespace castmesh::testing {
namespace {

using namespace std::chrono_literals;
// The transport side of a runtime, which these tests play.
using Seam = detail::RuntimeTransportSeam;

// A message type with a user-registered codec.
struct Point {
  int x = 0;
  int y = 0;
};
absl::Status encode_point(const Point& p, std::string* out) {
  *out = std::to_string(p.x) + "," + std::to_string(p.y);
  return absl::OkStatus();
}
absl::Status decode_point(std::string_view in, Point* p) {
  const size_t comma = in.find(',');
  if (comma == std::string_view::npos) return absl::InvalidArgumentError("no comma");
  p->x = std::stoi(std::string(in.substr(0, comma)));
  p->y = std::stoi(std::string(in.substr(comma + 1)));
  return absl::OkStatus();
}
CASTMESH_REGISTER_MESSAGE(Point, "test.Point", encode_point, decode_point);

struct NoCodec {};  // never crosses procs

struct AskPeer {
  int x;
};
class Geometry : public Actor {
 public:
  Point mirror(const Point& p) { return Point{p.y, p.x}; }
  std::string upper(google::protobuf::StringValue v) {
    std::string s = v.value();
    for (auto& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    return s;
  }
  int no_codec(const NoCodec&) { return 0; }
  using Handlers = castmesh::Handlers<&Geometry::mirror, &Geometry::upper, &Geometry::no_codec>;
};

// Carries WireMessages between runtimes by proc id, as bytes only.
class LoopbackRouter : public detail::RemoteRouter {
 public:
  void add(Runtime* rt) {
    std::lock_guard<std::mutex> lock(mu_);
    procs_[rt->proc_id()] = rt;
  }
  void remove(const ProcId& p) {
    std::lock_guard<std::mutex> lock(mu_);
    procs_.erase(p);
  }
  void route(detail::WireMessage msg) override {
    routed_.fetch_add(1);
    Runtime* target = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = procs_.find(msg.destination.proc);
      if (it != procs_.end()) target = it->second;
    }
    if (target == nullptr) return;  // proc gone: like a lost connection
    // Serialize the parts a transport would send, then rebuild.
    detail::WireMessage copy;
    copy.destination = Address::from_bytes(msg.destination.to_bytes()).value();
    copy.port = msg.port;
    copy.sender = msg.sender;
    copy.type_name = msg.type_name;
    copy.payload = std::string(msg.payload.data(), msg.payload.size());
    if (msg.reply_to) copy.reply_to = PortAddress::from_bytes(msg.reply_to->to_bytes()).value();
    copy.error = msg.error;
    absl::Status st = Seam::deliver_wire(*target, std::move(copy));
    if (!st.ok()) last_error_ = st;
  }
  void watch(const Address& actor) override { watched_.fetch_add(1); }

  std::atomic<int> routed_{0};
  std::atomic<int> watched_{0};
  absl::Status last_error_;

 private:
  std::mutex mu_;
  std::map<ProcId, Runtime*> procs_;
};

class RemoteSeam : public ::testing::Test {
 protected:
  void SetUp() override {
    router_ = std::make_shared<LoopbackRouter>();
    a_ = std::make_unique<Runtime>(RuntimeOptions{.workers = 2, .proc_id = "proc-a"});
    b_ = std::make_unique<Runtime>(RuntimeOptions{.workers = 2, .proc_id = "proc-b"});
    router_->add(a_.get());
    router_->add(b_.get());
    Seam::set_remote_router(*a_, router_);
    Seam::set_remote_router(*b_, router_);
  }
  void TearDown() override {
    b_.reset();
    a_.reset();
  }
  std::shared_ptr<LoopbackRouter> router_;
  std::unique_ptr<Runtime> a_, b_;
};

TEST_F(RemoteSeam, RegisteredCodecRoundTripsThroughBytes) {
  auto geo = b_->spawn<Geometry>();
  EXPECT_EQ(geo.address().proc, "proc-b");
  // A ref that travelled as bytes, used from proc-a.
  auto remote = ActorRef<Geometry>::from_bytes(geo.to_bytes()).value();
  auto via_a = ActorRef<Geometry>(a_->resolve(remote.address()).destination());
  auto r = via_a.ask(Point{1, 2}).get(10s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->x, 2);
  EXPECT_EQ(r->y, 1);
  EXPECT_GE(router_->routed_.load(), 2);  // request and answer both crossed as bytes
}

TEST_F(RemoteSeam, ProtobufMessagesGetACodecAutomatically) {
  auto geo = b_->spawn<Geometry>();
  auto via_a = ActorRef<Geometry>(a_->resolve(geo.address()).destination());
  google::protobuf::StringValue v;
  v.set_value("castmesh");
  auto r = via_a.ask(v).get(10s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "CASTMESH");
}

TEST_F(RemoteSeam, ErrorsAreClear) {
  auto geo = b_->spawn<Geometry>();
  auto via_a = ActorRef<Geometry>(a_->resolve(geo.address()).destination());
  // No codec for the message type: fails on the sending side.
  auto no = via_a.ask(NoCodec{}).get(10s);
  EXPECT_EQ(no.status().code(), absl::StatusCode::kFailedPrecondition) << no.status();
  // Unknown actor in the other proc.
  auto ghost = ActorRef<Geometry>(a_->resolve(Address{"proc-b", "ghost", 1}).destination());
  EXPECT_EQ(ghost.ask(Point{}).get(10s).status().code(), absl::StatusCode::kNotFound);
  // Unknown wire type name and malformed payloads, injected directly.
  EXPECT_EQ(Seam::deliver_serialized(*b_, geo.address(), "test.Nope", "").code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Seam::deliver_serialized(*b_, geo.address(), "test.Point", "garbage").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      Seam::deliver_serialized_reply(*a_, PortAddress{Address{"proc-a", "_reply", 0}, 999}, "castmesh.i32", "").code(),
      absl::StatusCode::kNotFound);
  // No router: kUnavailable naming the proc.
  Runtime lone(RuntimeOptions{.workers = 1, .proc_id = "lone"});
  auto r = ActorRef<Geometry>(lone.resolve(geo.address()).destination()).ask(Point{}).get(10s);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(r.status().message()).find("proc-b"), std::string::npos);
}

// A pending request to a proc that dies fails promptly.
TEST_F(RemoteSeam, PendingRequestsToADeadProcFail) {
  auto geo = b_->spawn<Geometry>();
  router_->remove("proc-b");  // messages to proc-b are now lost
  auto via_a = ActorRef<Geometry>(a_->resolve(geo.address()).destination());
  auto pending = via_a.ask(Point{3, 4});
  EXPECT_FALSE(pending.ready());
  Seam::fail_pending_to_proc(*a_, "proc-b", absl::UnavailableError("proc proc-b died"));
  auto r = pending.get(10s);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(r.status().message()).find("proc-b"), std::string::npos);
}

struct Watch {
  UntypedRef target;
};
struct Downs {};
class RemoteWatcher : public Actor {
 public:
  void watch(const Watch& w) { monitor(w.target); }
  void on_down(const DownEvent& e) override { downs_.push_back(e); }
  std::vector<DownEvent> downs(const Downs&) { return downs_; }
  using Handlers = castmesh::Handlers<&RemoteWatcher::watch, &RemoteWatcher::downs>;

 private:
  std::vector<DownEvent> downs_;
};

TEST_F(RemoteSeam, RemoteDownReachesMonitors) {
  auto geo = b_->spawn<Geometry>();
  auto watcher = a_->spawn<RemoteWatcher>();
  EXPECT_TRUE(watcher.ask(Watch{a_->resolve(geo.address())}).get(10s).ok());
  EXPECT_EQ(router_->watched_.load(), 1);
  Seam::report_proc_down(*a_, "proc-b", absl::UnavailableError("connection lost"));
  std::vector<DownEvent> downs;
  for (int i = 0; i < 5000 && downs.empty(); ++i) {
    downs = watcher.ask(Downs{}).get(10s).value();
    if (downs.empty()) std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(downs.size(), 1u);
  EXPECT_EQ(downs[0].actor, geo.address());
  EXPECT_EQ(downs[0].reason.code(), absl::StatusCode::kUnavailable);
}

// Holds a reply port inside proc-a and hands out its serialized address.
class PortHolder : public Actor {
 public:
  explicit PortHolder(OncePort<Point> p) : p_(std::move(p)) {}
  std::string bytes(const Get&) { return p_.to_bytes(); }
  using Handlers = castmesh::Handlers<&PortHolder::bytes>;

 private:
  OncePort<Point> p_;
};

TEST_F(RemoteSeam, OncePortCrossesProcsAsBytes) {
  auto [port, answer] = make_once_port<Point>();
  // Serialized inside proc-a, so the port registers with proc-a's runtime.
  auto holder = a_->spawn<PortHolder>(std::move(port));
  const std::string bytes = holder.ask(Get{}).get(10s).value();
  holder.stop();
  EXPECT_NE(bytes.find("proc-a/_reply[0]#"), std::string::npos) << bytes;
  // This plain thread's runtime is proc-b (the last created): the answer is
  // encoded there and routed back to proc-a as bytes.
  ASSERT_EQ(Runtime::current(), b_.get());
  OncePort<Point>::from_bytes(bytes).value().send(Point{7, 8});
  auto r = answer.get(10s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->x, 7);
  EXPECT_EQ(r->y, 8);
}

}  // namespace
}  // namespace castmesh::testing
