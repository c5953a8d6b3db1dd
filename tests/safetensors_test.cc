// Malformed safetensors files: each gives one clear error naming the file and the tensor.
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::test;
using nlohmann::json;

namespace {

std::string floats(int n) { return std::string(size_t(n) * 4, '\x01'); }

TEST(Safetensors, ReadsAValidFile) {
  TempDir d("st");
  json h = {{"a", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}},
            {"b", {{"dtype", "BF16"}, {"shape", {4}}, {"data_offsets", {24, 32}}}},
            {"__metadata__", {{"format", "pt"}}}};
  write_bytes(d.file("x.safetensors"), safetensors_bytes(h, floats(8)));
  auto f = SafetensorsFile::open(d.file("x.safetensors"));
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors().at("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f->tensors().at("b").dtype, DType::BF16);
  EXPECT_EQ(f->tensors().at("b").nbytes, 8u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
}

TEST(Safetensors, TruncatedLength) {
  TempDir d("st");
  write_bytes(d.file("t.safetensors"), "abc");
  const auto msg = error_of([&] { SafetensorsFile::open(d.file("t.safetensors")); });
  EXPECT_NE(msg.find("t.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(Safetensors, TruncatedHeader) {
  TempDir d("st");
  std::string bytes = safetensors_bytes(json::object(), "");
  uint64_t big = 5000;
  std::memcpy(bytes.data(), &big, 8);
  write_bytes(d.file("t.safetensors"), bytes);
  const auto msg = error_of([&] { SafetensorsFile::open(d.file("t.safetensors")); });
  EXPECT_NE(msg.find("truncated safetensors file: header claims 5000 bytes"), std::string::npos) << msg;
}

TEST(Safetensors, TruncatedData) {
  TempDir d("st");
  json h = {{"w", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}}};
  write_bytes(d.file("t.safetensors"), safetensors_bytes(h, floats(2)));
  const auto msg = error_of([&] { SafetensorsFile::open(d.file("t.safetensors")); });
  EXPECT_NE(msg.find("tensor 'w': data_offsets [0, 16] out of range (data section is 8 bytes)"), std::string::npos) << msg;
}

TEST(Safetensors, MalformedHeaderJson) {
  TempDir d("st");
  std::string h = "{\"w\": [1, 2";
  uint64_t n = h.size();
  write_bytes(d.file("m.safetensors"), std::string(reinterpret_cast<char*>(&n), 8) + h);
  const auto msg = error_of([&] { SafetensorsFile::open(d.file("m.safetensors")); });
  EXPECT_NE(msg.find("m.safetensors: malformed safetensors header"), std::string::npos) << msg;
}

TEST(Safetensors, MalformedEntry) {
  TempDir d("st");
  json h = {{"w", {{"dtype", "F32"}, {"shape", {4}}}}};
  write_bytes(d.file("m.safetensors"), safetensors_bytes(h, floats(4)));
  const auto msg = error_of([&] { SafetensorsFile::open(d.file("m.safetensors")); });
  EXPECT_NE(msg.find("tensor 'w': malformed header entry"), std::string::npos) << msg;
}

TEST(Safetensors, UnsupportedDtype) {
  TempDir d("st");
  json h = {{"ids", {{"dtype", "I64"}, {"shape", {2}}, {"data_offsets", {0, 16}}}}};
  write_bytes(d.file("u.safetensors"), safetensors_bytes(h, floats(4)));
  const auto msg = error_of([&] { SafetensorsFile::open(d.file("u.safetensors")); });
  EXPECT_NE(msg.find("u.safetensors: tensor 'ids': unsupported dtype I64"), std::string::npos) << msg;
}

TEST(Safetensors, ShapeDisagreesWithByteRange) {
  TempDir d("st");
  json h = {{"w", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 16}}}}};
  write_bytes(d.file("s.safetensors"), safetensors_bytes(h, floats(4)));
  const auto msg = error_of([&] { SafetensorsFile::open(d.file("s.safetensors")); });
  EXPECT_NE(msg.find("tensor 'w': shape [3] of F32 needs 12 bytes but data_offsets span 16"), std::string::npos) << msg;
}

TEST(Safetensors, OffsetsReversed) {
  TempDir d("st");
  json h = {{"w", {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {8, 4}}}}};
  write_bytes(d.file("r.safetensors"), safetensors_bytes(h, floats(4)));
  const auto msg = error_of([&] { SafetensorsFile::open(d.file("r.safetensors")); });
  EXPECT_NE(msg.find("tensor 'w': data_offsets [8, 4] out of range"), std::string::npos) << msg;
}

TEST(Safetensors, OverlappingOffsets) {
  TempDir d("st");
  json h = {{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
            {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}}};
  write_bytes(d.file("o.safetensors"), safetensors_bytes(h, floats(3)));
  const auto msg = error_of([&] { SafetensorsFile::open(d.file("o.safetensors")); });
  EXPECT_NE(msg.find("o.safetensors: tensors 'a' and 'b' have overlapping data_offsets"), std::string::npos) << msg;
}

TEST(Safetensors, MissingFile) {
  const auto msg = error_of([&] { SafetensorsFile::open("/nonexistent/x.safetensors"); });
  EXPECT_NE(msg.find("/nonexistent/x.safetensors: cannot open"), std::string::npos) << msg;
}

TEST(Checkpoint, ShardIndexNamesMissingShard) {
  TempDir d("ck");
  write_bytes(d.file("config.json"), "{}");
  write_bytes(d.file("model.safetensors.index.json"),
              json({{"weight_map", {{"w", "model-00001-of-00002.safetensors"}}}}).dump());
  const auto msg = error_of([&] { Checkpoint::open(d.path()); });
  EXPECT_NE(msg.find("model-00001-of-00002.safetensors: listed in model.safetensors.index.json but missing"),
            std::string::npos) << msg;
}

TEST(Checkpoint, MissingAndMisshapenAndUnexpectedTensors) {
  TempDir d("ck");
  write_bytes(d.file("config.json"), "{}");
  json h = {{"w", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}}},
            {"extra", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {16, 20}}}}};
  write_bytes(d.file("model.safetensors"), safetensors_bytes(h, floats(5)));
  Checkpoint c = Checkpoint::open(d.path());
  auto msg = error_of([&] { c.get("missing.weight", {2}); });
  EXPECT_NE(msg.find("missing tensor 'missing.weight'"), std::string::npos) << msg;
  msg = error_of([&] { c.get("w", {4, 1}); });
  EXPECT_NE(msg.find("model.safetensors: tensor 'w' has shape [2, 2], expected [4, 1]"), std::string::npos) << msg;
  c.get("w", {2, 2});
  msg = error_of([&] { c.check_all_used(); });
  EXPECT_NE(msg.find("model.safetensors: unexpected tensor 'extra'"), std::string::npos) << msg;
}

TEST(Checkpoint, MissingConfig) {
  TempDir d("ck");
  const auto msg = error_of([&] { Checkpoint::open(d.path()); });
  EXPECT_NE(msg.find("config.json: missing"), std::string::npos) << msg;
}

TEST(Checkpoint, MalformedConfigJson) {
  TempDir d("ck");
  write_bytes(d.file("config.json"), "{\"hidden_size\": 64,");
  const auto msg = error_of([&] { Checkpoint::open(d.path()); });
  EXPECT_NE(msg.find("config.json: malformed JSON"), std::string::npos) << msg;
}

}  // namespace
