// The bounded backlog of a proc's unsent output lines (src/core/output/line_backlog.h).
#include "core/output/line_backlog.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace castmesh::output {
namespace {

TEST(LineBacklog, KeepsOrderAndTakesBatchesOfAboutTheAskedSize) {
  LineBacklog backlog(1 << 20);
  for (int i = 0; i < 100; ++i) backlog.push(i % 2 + 1, "line " + std::to_string(i));
  std::vector<Line> all;
  while (!backlog.empty()) {
    std::vector<Line> batch;
    EXPECT_EQ(backlog.take(&batch, 64, absl::Milliseconds(10)), 0u);
    ASSERT_FALSE(batch.empty());
    size_t bytes = 0;
    for (const Line& l : batch) bytes += l.text.size() + 1;
    EXPECT_LE(bytes, 64u + 8u);
    all.insert(all.end(), batch.begin(), batch.end());
  }
  ASSERT_EQ(all.size(), 100u);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(all[i].text, "line " + std::to_string(i));
    EXPECT_EQ(all[i].stream, i % 2 + 1);
  }
}

TEST(LineBacklog, AFullBacklogDropsTheOldestAndCountsThem) {
  LineBacklog backlog(100);  // room for ten 9-byte lines (8 + newline)
  for (int i = 0; i < 25; ++i) backlog.push(1, "line " + std::string(i < 10 ? "0" : "") + std::to_string(i) + "x");
  std::vector<Line> batch;
  EXPECT_EQ(backlog.take(&batch, 1 << 20, absl::Milliseconds(10)), 14u);
  ASSERT_EQ(batch.size(), 11u);
  EXPECT_EQ(batch.front().text, "line 14x");  // the newest eleven are kept
  EXPECT_EQ(batch.back().text, "line 24x");
  batch.clear();
  EXPECT_EQ(backlog.take(&batch, 1 << 20, absl::Milliseconds(1)), 0u) << "dropped lines are reported once";
}

TEST(LineBacklog, AWriterNeverWaitsForTheReader) {
  LineBacklog backlog(4096);
  std::thread writer([&] {
    for (int i = 0; i < 100000; ++i) backlog.push(1, "a line the reader is too slow for");
  });
  writer.join();  // finishes although nobody reads
  std::vector<Line> batch;
  EXPECT_GT(backlog.take(&batch, 1 << 20, absl::Milliseconds(1)), 0u);
}

TEST(LineBacklog, CloseWakesAWaitingReader) {
  LineBacklog backlog(4096);
  std::thread closer([&] { backlog.close(); });
  std::vector<Line> batch;
  EXPECT_EQ(backlog.take(&batch, 1024, absl::Seconds(30)), 0u);  // returns long before 30 s
  EXPECT_TRUE(batch.empty());
  closer.join();
}

}  // namespace
}  // namespace castmesh::output
