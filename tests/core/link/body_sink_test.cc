// BodySink (core/link/body_sink.h): wanted bytes land where the path says,
// unwanted ones are read past without touching the destination, in pieces
// as the transport hands them over.
#include "core/link/body_sink.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

namespace castmesh::link {
namespace {

// Wants the body in `dest` unless `wanted` is false; records finish().
class TestSink final : public BodySink {
 public:
  explicit TestSink(bool wanted, size_t size) : wanted_(wanted), dest(size, '.') {}
  void finish(bool complete) override { finished = complete ? 1 : 0; }

  const bool wanted_;
  std::string dest;
  int finished = -1;

 protected:
  std::optional<size_t> receive_wanted(size_t at, size_t n, const Take& take) override {
    if (!wanted_) return std::nullopt;
    return take(dest.data() + at, n);
  }
};

// Feeds `body` to `sink` as the transport would: up to `piece` bytes per call.
void feed(BodySink& sink, const std::string& body, size_t piece) {
  size_t at = 0;
  while (at < body.size()) {
    const size_t n = std::min(piece, body.size() - at);
    const size_t got = sink.receive(at, n, [&](char* into, size_t max) {
      const size_t k = std::min(max, n);
      std::memcpy(into, body.data() + at, k);
      return k;
    });
    ASSERT_GT(got, 0u);
    at += got;
  }
  sink.finish(true);
}

TEST(BodySink, WantedBytesLandInPlaceInPieces) {
  const std::string body = "0123456789abcdefghij";
  TestSink sink(/*wanted=*/true, body.size());
  feed(sink, body, 7);
  EXPECT_EQ(sink.dest, body);
  EXPECT_EQ(sink.finished, 1);
}

TEST(BodySink, UnwantedBytesAreReadPastWithoutTouchingTheDestination) {
  const std::string body(200 * 1024, 'x');  // more than the scratch holds at once
  TestSink sink(/*wanted=*/false, body.size());
  feed(sink, body, 100 * 1024);
  EXPECT_EQ(sink.dest, std::string(body.size(), '.'));
  EXPECT_EQ(sink.finished, 1);
}

}  // namespace
}  // namespace castmesh::link
