// A drafter paired with the wrong target, or published with a broken or incomplete config,
// is caught before the first token, with an error that says what is wrong.
#include "io/checkpoint.h"
#include "model/dflash_drafter.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::test;
using nlohmann::json;

namespace {

const char* kTarget = "qwen3-gqa4-untied-f32";
const char* kDrafter = "dflash-qwen3-gqa4-untied-f32";

struct PairingFixture : ::testing::Test {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::unique_ptr<Qwen3Model> target = Qwen3Model::load(tiny(kTarget), *backend);
  TempDir dir{"pairing"};

  // A copy of the tiny drafter whose config.json is edited by `edit`.
  std::string drafter_with(const std::function<void(json&)>& edit) {
    copy_dir(tiny(kDrafter), dir.path());
    json c = read_json_file(dir.file("config.json"));
    edit(c);
    write_bytes(dir.file("config.json"), c.dump(2));
    return dir.path();
  }
  std::string load_error(const std::string& d) {
    return error_of([&] { DFlashDrafter::load(d, *target); });
  }
};

TEST_F(PairingFixture, CorrectPairLoads) {
  std::vector<std::string> warnings;
  auto d = DFlashDrafter::load(tiny(kDrafter), *target, &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(d->config().target_layer_ids, (std::vector<int>{0, 1}));
  EXPECT_EQ(d->config().mask_token_id, 255);
}

TEST_F(PairingFixture, WrongNumTargetLayers) {
  const auto msg = load_error(drafter_with([](json& c) { c["num_target_layers"] = 36; }));
  EXPECT_NE(msg.find("num_target_layers: drafter was built for 36 target layers, target has 3"), std::string::npos) << msg;
}

TEST_F(PairingFixture, TargetLayerIdOutOfRange) {
  const auto msg = load_error(drafter_with([](json& c) { c["dflash_config"]["target_layer_ids"] = {1, 3}; }));
  EXPECT_NE(msg.find("target layer ids: [1,3] must be distinct and within 0 … 2"), std::string::npos) << msg;
}

// A layer id past int's range used to wrap (4294967297 read as layer 1) and be accepted.
TEST_F(PairingFixture, TargetLayerIdPastIntRange) {
  const auto msg = load_error(drafter_with([](json& c) { c["dflash_config"]["target_layer_ids"] = {0, 4294967297LL}; }));
  EXPECT_NE(msg.find("config.json: field 'target_layer_ids' is out of range, got 4294967297"), std::string::npos) << msg;
}

// A string where an int belongs used to escape as nlohmann's type_error, naming no file.
TEST_F(PairingFixture, BlockSizeOfTheWrongType) {
  const auto msg = load_error(drafter_with([](json& c) { c["block_size"] = "16"; }));
  EXPECT_NE(msg.find("config.json: field 'block_size' must be an integer, got \"16\""), std::string::npos) << msg;
}

// head_dim 0 used to divide the projections' rows by zero (SIGFPE) before any check ran.
TEST_F(PairingFixture, HeadDimZero) {
  const auto msg = load_error(drafter_with([](json& c) { c["head_dim"] = 0; }));
  EXPECT_NE(msg.find("config.json: field 'head_dim' must be positive, got 0"), std::string::npos) << msg;
}

TEST_F(PairingFixture, MaskIdOutsideTheEmbedding) {
  const auto msg = load_error(drafter_with([](json& c) { c["dflash_config"]["mask_token_id"] = 256; }));
  EXPECT_NE(msg.find("mask token id: mask_token_id 256, embedding rows 256"), std::string::npos) << msg;
}

TEST_F(PairingFixture, MaskIdMissingWithNoTokenizerToDeriveIt) {
  const auto msg = load_error(drafter_with([](json& c) { c["dflash_config"].erase("mask_token_id"); }));
  EXPECT_NE(msg.find("field 'mask_token_id' is missing and cannot be derived"), std::string::npos) << msg;
}

TEST_F(PairingFixture, MaskIdThatIsARealToken) {
  // Give the target a tokenizer that defines ids 0 … 255: then 255 is a real token.
  TempDir tdir("target");
  copy_dir(tiny(kTarget), tdir.path());
  json vocab = json::object();
  // appended piece by piece: GCC 12 warns falsely (-Wrestrict) on a literal + a temporary string
  for (int i = 0; i < 256; ++i) vocab[std::string("t").append(std::to_string(i))] = i;
  write_bytes(tdir.file("tokenizer.json"), json({{"model", {{"type", "BPE"}, {"vocab", vocab}}}, {"added_tokens", json::array()}}).dump());
  auto t = Qwen3Model::load(tdir.path(), *backend);
  const auto msg = error_of([&] { DFlashDrafter::load(tiny(kDrafter), *t); });
  EXPECT_NE(msg.find("mask token id: mask_token_id 255, embedding rows 256, tokenizer ids 0 … 255 are real tokens"),
            std::string::npos) << msg;
}

TEST_F(PairingFixture, VocabularyMismatch) {
  const auto msg = load_error(drafter_with([](json& c) { c["vocab_size"] = 151936; }));
  EXPECT_NE(msg.find("vocabulary: drafter vocab_size 151936, target embedding rows 256"), std::string::npos) << msg;
}

TEST_F(PairingFixture, HiddenSizeMismatch) {
  auto small = Qwen3Model::load(tiny("qwen3-vocab16-f32"), *backend);  // hidden 32
  const auto msg = error_of([&] { DFlashDrafter::load(tiny(kDrafter), *small); });
  EXPECT_NE(msg.find("hidden size: drafter 64, target 32"), std::string::npos) << msg;
}

TEST_F(PairingFixture, RopeThetaDiffersFromTheTarget) {
  const auto msg = load_error(drafter_with([](json& c) { c["rope_theta"] = 10000.0; }));
  EXPECT_NE(msg.find("RoPE: drafter default theta=10000"), std::string::npos) << msg;
}

TEST_F(PairingFixture, DrafterInheritsTheTargetsRopeScaling) {
  // The yarn pair: the drafter's config states only rope_theta; it must rotate with yarn.
  auto yarn_target = Qwen3Model::load(tiny("qwen3-yarn-bf16"), *backend);
  auto d = DFlashDrafter::load(tiny("dflash-qwen3-yarn-bf16"), *yarn_target);
  EXPECT_EQ(d->config().layers.rope.type, "yarn");
  EXPECT_EQ(d->config().layers.rope, yarn_target->config().rope);
}

TEST_F(PairingFixture, DrafterWithItsOwnLmHeadIsRefused) {
  copy_dir(tiny(kDrafter), dir.path());
  // Rewrite the safetensors file with an extra lm_head.weight, as the speculators format has.
  auto f = SafetensorsFile::open(dir.file("model.safetensors"));
  json header = json::object();
  std::string data;
  for (const auto& [name, t] : f->tensors()) {
    header[name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.nbytes}}};
    data.append(reinterpret_cast<const char*>(t.data), t.nbytes);
  }
  const size_t head_bytes = 100 * 64 * 4;
  header["lm_head.weight"] = {{"dtype", "F32"}, {"shape", {100, 64}}, {"data_offsets", {data.size(), data.size() + head_bytes}}};
  data.append(head_bytes, '\0');
  const std::string bytes = safetensors_bytes(header, data);
  f.reset();
  write_bytes(dir.file("model.safetensors"), bytes);
  const auto msg = load_error(dir.path());
  EXPECT_NE(msg.find("LM head: the drafter carries its own LM head"), std::string::npos) << msg;
}

TEST_F(PairingFixture, MissingFieldsAreGuessedLoudly) {
  const auto d = drafter_with([](json& c) {
    c.erase("num_target_layers");
    c.erase("block_size");
    c["dflash_config"].erase("target_layer_ids");
    c.erase("num_attention_heads");
  });
  std::vector<std::string> warnings;
  auto dr = DFlashDrafter::load(d, *target, &warnings);
  // K = fc columns / target hidden = 2; default ids for L = 3 are round(1 + i·(3−4)/1) = [1, 0].
  EXPECT_EQ(dr->config().target_layer_ids, (std::vector<int>{1, 0}));
  EXPECT_EQ(dr->config().block_size, 16);
  EXPECT_EQ(dr->config().layers.num_attention_heads, 8);
  ASSERT_EQ(warnings.size(), 4u);
  std::string all;
  for (const auto& w : warnings) all += w + "\n";
  EXPECT_NE(all.find("num_attention_heads=8"), std::string::npos) << all;
  EXPECT_NE(all.find("target_layer_ids=[1,0]"), std::string::npos) << all;
}

TEST_F(PairingFixture, GuessesRecordedInAWrittenConfigAreStillReported) {
  const auto d = drafter_with([](json& c) { c["dflash_guessed_fields"] = {"target_layer_ids", "block_size"}; });
  std::vector<std::string> warnings;
  DFlashDrafter::load(d, *target, &warnings);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("target_layer_ids (guessed when this config was written)"), std::string::npos) << warnings[0];
}

TEST(DefaultTargetLayerIds, MatchThePublishersFormula) {
  EXPECT_EQ(default_target_layer_ids(36, 5), (std::vector<int>{1, 9, 17, 25, 33}));
  EXPECT_EQ(default_target_layer_ids(28, 1), (std::vector<int>{14}));
  EXPECT_EQ(default_target_layer_ids(64, 5), (std::vector<int>{1, 16, 31, 46, 61}));
}

// --- config.json errors -----------------------------------------------------------------

struct ConfigFixture : ::testing::Test {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  TempDir dir{"config"};
  std::string target_with(const std::function<void(json&)>& edit) {
    copy_dir(tiny(kTarget), dir.path());
    json c = read_json_file(dir.file("config.json"));
    edit(c);
    write_bytes(dir.file("config.json"), c.dump(2));
    return dir.path();
  }
  std::string load_error(const std::string& d) {
    return error_of([&] { Qwen3Model::load(d, *backend); });
  }
};

TEST_F(ConfigFixture, MissingField) {
  const auto msg = load_error(target_with([](json& c) { c.erase("hidden_size"); }));
  EXPECT_NE(msg.find("config.json: field 'hidden_size' is missing"), std::string::npos) << msg;
}

TEST_F(ConfigFixture, WrongFieldType) {
  const auto msg = load_error(target_with([](json& c) { c["num_hidden_layers"] = "three"; }));
  EXPECT_NE(msg.find("field 'num_hidden_layers' must be an integer"), std::string::npos) << msg;
}

TEST_F(ConfigFixture, MissingRopeTheta) {
  const auto msg = load_error(target_with([](json& c) { c.erase("rope_theta"); c.erase("rope_parameters"); }));
  EXPECT_NE(msg.find("field 'rope_theta' is missing"), std::string::npos) << msg;
}

TEST_F(ConfigFixture, UnsupportedRopeType) {
  const auto msg = load_error(target_with([](json& c) { c["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}}; }));
  EXPECT_NE(msg.find("'longrope' is not supported"), std::string::npos) << msg;
}

TEST_F(ConfigFixture, RopeThetaNotPositive) {
  const auto msg = load_error(target_with([](json& c) { c["rope_theta"] = -10000.0; c.erase("rope_parameters"); }));
  EXPECT_NE(msg.find("config.json: field 'rope_theta' must be positive"), std::string::npos) << msg;
}

// A factor that rounds to zero in float32 divides the low frequencies by zero: the loader
// refuses it, naming the file, instead of rotating by infinities.
TEST_F(ConfigFixture, RopeFrequenciesNotFinite) {
  const auto msg = load_error(target_with([](json& c) {
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 1e-300}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  }));
  EXPECT_NE(msg.find("config.json: the RoPE parameters (llama3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("give rotation frequencies that are not finite numbers"), std::string::npos) << msg;
}

TEST_F(ConfigFixture, ConfigDisagreesWithTensorShapes) {
  const auto msg = load_error(target_with([](json& c) { c["intermediate_size"] = 128; }));
  EXPECT_NE(msg.find("tensor 'model.layers.0.mlp.gate_proj.weight' has shape [160, 64], expected [128, 64]"),
            std::string::npos) << msg;
}

TEST_F(ConfigFixture, UntiedModelWithoutLmHead) {
  TempDir d2("config2");  // a tied checkpoint (no lm_head.weight) whose config says untied
  copy_dir(tiny("qwen3-gqa1-tied-f32"), d2.path());
  json c = read_json_file(d2.file("config.json"));
  c["tie_word_embeddings"] = false;
  write_bytes(d2.file("config.json"), c.dump());
  const auto m2 = error_of([&] { Qwen3Model::load(d2.path(), *backend); });
  EXPECT_NE(m2.find("missing tensor 'lm_head.weight' (config.json says tie_word_embeddings is false)"), std::string::npos) << m2;
}

TEST_F(ConfigFixture, WrongArchitecture) {
  const auto msg = load_error(target_with([](json& c) { c["architectures"] = {"LlamaForCausalLM"}; }));
  EXPECT_NE(msg.find("field 'architectures' is LlamaForCausalLM"), std::string::npos) << msg;
}

}  // namespace
