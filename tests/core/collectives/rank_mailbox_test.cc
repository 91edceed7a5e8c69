// RankMailbox::sink_for: a frame body read straight into the receive it
// matched (the transport's payload sink), in arrival order, with the same
// errors as a delivered message.
#include "core/collectives/rank_mailbox.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace castmesh::collectives {
namespace {

PostedRecv posted(std::vector<char>& buffer, int source, int64_t tag) {
  PostedRecv recv;
  recv.source = source;
  recv.tag = tag;
  recv.buffer = buffer.data();
  recv.capacity = buffer.size();
  recv.request = std::make_shared<detail::RequestState>();
  return recv;
}

MessageKey key_from(int source, int64_t tag) {
  MessageKey key;
  key.source = source;
  key.tag = tag;
  return key;
}

// Feeds `body` to `sink` in pieces of at most `piece` bytes, as the endpoint does.
void feed(transport::PayloadSink& sink, const std::string& body, size_t piece) {
  size_t at = 0;
  while (at < body.size()) {
    const size_t n = sink.receive(at, std::min(piece, body.size() - at), [&](char* into, size_t max) {
      std::memcpy(into, body.data() + at, max);
      return max;
    });
    ASSERT_GT(n, 0u);
    at += n;
  }
}

TEST(RankMailboxSink, BodyLandsInThePostedReceiveInPieces) {
  RankMailbox box;
  std::vector<char> buffer(100, '.');
  PostedRecv recv = posted(buffer, 2, 7);
  box.post(recv);
  auto sink = box.sink_for(key_from(2, 7), 90);
  ASSERT_NE(sink, nullptr);
  EXPECT_FALSE(recv.request->done());
  const std::string body(90, 'x');
  feed(*sink, body, 7);
  EXPECT_FALSE(recv.request->done());  // complete only when the frame ends
  sink->finish(true);
  auto status = recv.request->wait(absl::Seconds(1));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->source, 2);
  EXPECT_EQ(status->tag, 7);
  EXPECT_EQ(status->bytes, 90u);
  EXPECT_EQ(std::string(buffer.data(), 90), body);
  EXPECT_EQ(buffer[90], '.');
}

TEST(RankMailboxSink, NoSinkWithoutAMatchingReceiveAndArrivalOrderKept) {
  RankMailbox box;
  EXPECT_EQ(box.sink_for(key_from(1, 5), 10), nullptr);  // nothing posted: deliver() comes later
  std::vector<char> first(10), second(10);
  PostedRecv a = posted(first, kAnySource, 5), b = posted(second, kAnySource, 5);
  box.post(a);
  box.post(b);
  auto sink = box.sink_for(key_from(1, 5), 10);  // takes the first posted
  ASSERT_NE(sink, nullptr);
  box.deliver(key_from(3, 5), "0123456789", 10);  // a later message matches the second
  feed(*sink, "abcdefghij", 4);
  sink->finish(true);
  EXPECT_EQ(std::string(first.data(), 10), "abcdefghij");
  EXPECT_EQ(std::string(second.data(), 10), "0123456789");
}

TEST(RankMailboxSink, TooSmallReceiveFailsAndTheBodyIsSkipped) {
  RankMailbox box;
  std::vector<char> buffer(8, '.');
  PostedRecv recv = posted(buffer, 0, 1);
  box.post(recv);
  auto sink = box.sink_for(key_from(0, 1), 100);
  ASSERT_NE(sink, nullptr);
  feed(*sink, std::string(100, 'z'), 33);
  sink->finish(true);
  auto status = recv.request->wait(absl::Seconds(1));
  EXPECT_EQ(status.status().code(), absl::StatusCode::kOutOfRange) << status.status();
  EXPECT_EQ(std::string(buffer.data(), 8), "........");
}

TEST(RankMailboxSink, LostConnectionFailsTheClaimedReceive) {
  RankMailbox box;
  std::vector<char> buffer(64);
  PostedRecv recv = posted(buffer, 4, 0);
  box.post(recv);
  auto sink = box.sink_for(key_from(4, 0), 64);
  ASSERT_NE(sink, nullptr);
  feed(*sink, std::string(10, 'q'), 10);
  sink->finish(false);
  auto status = recv.request->wait(absl::Seconds(1));
  EXPECT_EQ(status.status().code(), absl::StatusCode::kUnavailable) << status.status();
}

}  // namespace
}  // namespace castmesh::collectives
