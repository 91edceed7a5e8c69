#include "core/debug/chrome_trace.h"

#include <sstream>

#include "core/debug/trace_service.h"
#include "gtest/gtest.h"

namespace castmesh::trace {
namespace {

Record slice_record(int64_t start, int64_t duration, uint32_t name) {
  return Record{start, duration, 0, 0, name, 0, Category::kHandler, RecordKind::kSlice};
}
Record flow_record(RecordKind kind, uint64_t id, int64_t at) {
  return Record{at, 0, id, 0, 1, 0, Category::kSend, kind};
}

ProcTrace proc_with(std::string label, int64_t offset, std::vector<Record> records) {
  ProcTrace p;
  p.label = std::move(label);
  p.clock_offset_ns = offset;
  p.texts = {"", "outer", "inner"};
  ThreadRecords t;
  t.tid = 7;
  t.name = "castmesh-worker";
  t.records = std::move(records);
  p.threads.push_back(std::move(t));
  return p;
}

TEST(JsonString, EscapesWhatJsonNeeds) {
  EXPECT_EQ(json_string("a\"b\\c\n\t\x01"), "\"a\\\"b\\\\c\\n\\t\\u0001\"");
  EXPECT_EQ(json_string("plain é"), "\"plain é\"");
}

TEST(ChromeTrace, SlicesAreSortedByStartWithTheEnclosingOneFirst) {
  // Recorded in end order: the inner slice ends (and is recorded) first.
  std::vector<ProcTrace> procs = {proc_with("p", 0, {slice_record(2000, 100, 2), slice_record(1000, 5000, 1)})};
  std::ostringstream out;
  WriteCounts counts = write_chrome_trace(out, procs);
  EXPECT_EQ(counts.events, 2u);
  const std::string json = out.str();
  const size_t outer = json.find("\"name\":\"outer\"");
  const size_t inner = json.find("\"name\":\"inner\"");
  ASSERT_NE(outer, std::string::npos);
  ASSERT_NE(inner, std::string::npos);
  EXPECT_LT(outer, inner);
  // Times in microseconds from the earliest record.
  EXPECT_NE(json.find("\"ts\":0.000,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"ts\":1.000,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"dur\":5.000"), std::string::npos) << json;
  EXPECT_NE(json.find("\"name\":\"process_name\",\"args\":{\"name\":\"p\"}"), std::string::npos);
  EXPECT_NE(json.find("\"thread_name\",\"args\":{\"name\":\"castmesh-worker\"}"), std::string::npos);
}

TEST(ChromeTrace, FlowsNeedBothEndsAndClocksAreShifted) {
  // Proc b's clock runs 1 ms ahead of the controller's.
  std::vector<ProcTrace> procs = {
      proc_with("a", 0, {flow_record(RecordKind::kFlowOut, 5, 10'000), flow_record(RecordKind::kFlowOut, 6, 11'000)}),
      proc_with("b", 1'000'000, {flow_record(RecordKind::kFlowIn, 5, 1'012'000)})};
  std::ostringstream out;
  WriteCounts counts = write_chrome_trace(out, procs);
  EXPECT_EQ(counts.unmatched_flows, 1u);  // flow 6 ended nowhere
  EXPECT_EQ(counts.events, 2u);
  const std::string json = out.str();
  EXPECT_NE(json.find("{\"ph\":\"s\",\"pid\":1,\"tid\":7,\"ts\":0.000"), std::string::npos) << json;
  EXPECT_NE(json.find("{\"ph\":\"f\",\"pid\":2,\"tid\":7,\"ts\":2.000"), std::string::npos) << json;
  EXPECT_NE(json.find("\"id\":\"0x5\",\"bp\":\"e\""), std::string::npos) << json;
  EXPECT_EQ(json.find("\"id\":\"0x6\""), std::string::npos) << json;
}

TEST(TraceRecordsWire, PackAndUnpackRoundTrip) {
  std::vector<Record> records = {
      Record{-5, 10, 1ull << 60, 99, 3, 4, Category::kRdma, RecordKind::kSlice},
      Record{7, 0, 8, 0, 1, 0, Category::kCollective, RecordKind::kInstant}};
  absl::StatusOr<std::vector<Record>> back = unpack_records(pack_records(records));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].start_ns, -5);
  EXPECT_EQ((*back)[0].flow, 1ull << 60);
  EXPECT_EQ((*back)[0].category, Category::kRdma);
  EXPECT_EQ((*back)[1].kind, RecordKind::kInstant);
}

TEST(TraceRecordsWire, MalformedRecordsAreRefused) {
  absl::StatusOr<std::vector<Record>> partial = unpack_records(std::string(47, '\0'));
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(partial.status().message().find("not whole 48-byte records"), std::string::npos);
  std::string bad = pack_records({Record{}});
  bad[40] = 99;  // an unknown category
  EXPECT_EQ(unpack_records(bad).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace castmesh::trace
