// `dflash inspect` (model/inspect.h): checkpoint descriptions, config agreement, drafter
// pairing reports and configs rebuilt for drafters published without one.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "io/checkpoint.h"
#include "model/dflash_drafter.h"
#include "model/inspect.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::test;
using nlohmann::json;

namespace {

int64_t independent_parameter_count(const std::string& dir) {
  const Checkpoint ck = Checkpoint::open(dir, /*require_config=*/false);
  int64_t n = 0;
  for (const auto& name : ck.names()) n += ck.peek(name).numel();
  return n;
}

const DrafterField& field(const InspectReport& r, const std::string& name) {
  for (const auto& f : r.drafter->fields)
    if (f.name == name) return f;
  throw Error("no field " + name);
}

const PairingLine* line(const PairingReport& p, const std::string& what) {
  for (const auto& l : p.lines)
    if (l.what == what) return &l;
  return nullptr;
}

std::string all_lines(const PairingReport& p) { return p.to_text(); }

struct TargetCase {
  const char* name;
  DType dtype;
  bool tied;
  size_t files;
};

class InspectTarget : public ::testing::TestWithParam<TargetCase> {};

TEST_P(InspectTarget, DescribesTheTinyCheckpoint) {
  const auto& tc = GetParam();
  const InspectReport r = inspect_checkpoint(tiny(tc.name));
  EXPECT_EQ(r.kind, ModelKind::Qwen3Target);
  EXPECT_EQ(r.architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(r.has_config);
  EXPECT_EQ(r.files.size(), tc.files);
  EXPECT_EQ(r.parameters, independent_parameter_count(tiny(tc.name)));
  int64_t sum = 0;
  uint64_t bytes = 0;
  for (const auto& t : r.tensors) {
    sum += t.numel();
    bytes += t.bytes;
    EXPECT_EQ(t.bytes, uint64_t(t.numel()) * dtype_size(t.dtype)) << t.name;
  }
  EXPECT_EQ(r.parameters, sum);
  EXPECT_EQ(r.bytes, bytes);
  ASSERT_EQ(r.dtypes.size(), 1u);
  EXPECT_EQ(r.dtypes[0].dtype, tc.dtype);
  EXPECT_EQ(r.dtypes[0].parameters, r.parameters);
  ASSERT_TRUE(r.target_config.has_value());
  EXPECT_EQ(r.target_config->tie_word_embeddings, tc.tied);
  EXPECT_TRUE(r.agreement.checked);
  EXPECT_TRUE(r.agreement.ok()) << r.to_text(false);
  EXPECT_TRUE(r.ok());
  // Every layer tensor, the embedding, the final norm, and the LM head when untied.
  const int L = r.target_config->num_hidden_layers;
  EXPECT_EQ(r.agreement.expected_tensors, 2 + 11 * L + (tc.tied ? 0 : 1));
  EXPECT_NE(r.to_text().find("config agreement: OK"), std::string::npos);
  const auto j = r.to_json();
  EXPECT_EQ(j["kind"], "qwen3-target");
  EXPECT_EQ(j["parameters"], r.parameters);
  EXPECT_EQ(j["tensors"].size(), r.tensors.size());
  EXPECT_TRUE(j["config_agreement"]["ok"].get<bool>());
}

INSTANTIATE_TEST_SUITE_P(InspectTiny, InspectTarget,
                         ::testing::Values(TargetCase{"qwen3-gqa1-tied-f32", DType::F32, true, 1},
                                           TargetCase{"qwen3-gqa2-bf16", DType::BF16, true, 1},
                                           TargetCase{"qwen3-gqa4-untied-f32", DType::F32, false, 1},
                                           TargetCase{"qwen3-linear-f16-tied", DType::F16, true, 1},
                                           TargetCase{"qwen3-llama3rope-f32-sharded", DType::F32, false, 3},
                                           TargetCase{"qwen3-vocab16-f32", DType::F32, true, 1},
                                           TargetCase{"qwen3-yarn-bf16", DType::BF16, false, 1}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (auto& ch : n) if (ch == '-') ch = '_';
                           return n;
                         });

struct DrafterCase {
  const char* drafter;
  const char* target;
  DType dtype;
};
const DrafterCase kPairs[] = {{"dflash-qwen3-gqa1-tied-f32", "qwen3-gqa1-tied-f32", DType::F32},
                              {"dflash-qwen3-gqa4-untied-f32", "qwen3-gqa4-untied-f32", DType::F32},
                              {"dflash-qwen3-yarn-bf16", "qwen3-yarn-bf16", DType::BF16},
                              {"dflash-qwen3-vocab16-f32", "qwen3-vocab16-f32", DType::F32}};

class InspectDrafter : public ::testing::TestWithParam<DrafterCase> {};

TEST_P(InspectDrafter, DescribesTheTinyDrafter) {
  const auto& dc = GetParam();
  const json cfg = read_json_file(tiny(dc.drafter) + "/config.json");
  const InspectReport r = inspect_checkpoint(tiny(dc.drafter));
  EXPECT_EQ(r.kind, ModelKind::DFlashDrafter);
  EXPECT_EQ(r.architecture, "DFlashDraftModel");
  EXPECT_EQ(r.parameters, independent_parameter_count(tiny(dc.drafter)));
  ASSERT_EQ(r.dtypes.size(), 1u);
  EXPECT_EQ(r.dtypes[0].dtype, dc.dtype);
  EXPECT_TRUE(r.agreement.ok()) << r.to_text(false);
  ASSERT_TRUE(r.drafter.has_value());
  ASSERT_TRUE(r.drafter->config_valid);
  for (const auto& f : r.drafter->fields) EXPECT_EQ(f.source, "config.json") << f.name;
  EXPECT_EQ(field(r, "num_hidden_layers").value, cfg["num_hidden_layers"]);
  EXPECT_EQ(field(r, "target_layer_ids").value, cfg["dflash_config"]["target_layer_ids"]);
  EXPECT_EQ(field(r, "mask_token_id").value, cfg["dflash_config"]["mask_token_id"]);
  // Without a target, K uses the drafter's own hidden size, and says so.
  EXPECT_EQ(r.drafter->target_hidden, cfg["hidden_size"].get<int64_t>());
  EXPECT_NE(r.drafter->k_note.find("ASSUMED"), std::string::npos) << r.drafter->k_note;

  // With the target, K is the real one: fc columns / target hidden = the number of layer ids.
  InspectOptions opt;
  opt.target_dir = tiny(dc.target);
  const InspectReport rt = inspect_checkpoint(tiny(dc.drafter), opt);
  EXPECT_EQ(rt.drafter->k, static_cast<int>(cfg["dflash_config"]["target_layer_ids"].size()));
  EXPECT_EQ(rt.drafter->k_note.find("ASSUMED"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(InspectTiny, InspectDrafter, ::testing::ValuesIn(kPairs), [](const auto& info) {
  std::string n = info.param.drafter;
  for (auto& ch : n) if (ch == '-') ch = '_';
  return n;
});

class InspectPairing : public ::testing::TestWithParam<DrafterCase> {};

TEST_P(InspectPairing, TinyPairsPass) {
  const auto& dc = GetParam();
  const PairingReport p = inspect_pairing(tiny(dc.drafter), tiny(dc.target));
  EXPECT_TRUE(p.ok()) << p.to_text();
  for (const auto& l : p.lines) EXPECT_EQ(l.status, PairingLine::Status::Pass) << l.what << ": " << l.detail;
  for (const char* what : {"target checkpoint", "drafter checkpoint", "drafter config", "hidden size", "fc input width",
                           "vocabulary", "num_target_layers", "target layer ids", "mask token id", "RoPE", "LM head",
                           "block size", "dtypes"})
    EXPECT_NE(line(p, what), nullptr) << what;
  EXPECT_NE(p.to_text().find("result: PASS"), std::string::npos);
  EXPECT_TRUE(p.to_json()["ok"].get<bool>());
}

INSTANTIATE_TEST_SUITE_P(InspectTiny, InspectPairing, ::testing::ValuesIn(kPairs), [](const auto& info) {
  std::string n = info.param.drafter;
  for (auto& ch : n) if (ch == '-') ch = '_';
  return n;
});

TEST(InspectPairingMismatch, Gqa4DrafterWithVocab16TargetFails) {
  const PairingReport p = inspect_pairing(tiny("dflash-qwen3-gqa4-untied-f32"), tiny("qwen3-vocab16-f32"));
  EXPECT_FALSE(p.ok());
  const std::string text = all_lines(p);
  EXPECT_NE(text.find("FAIL  hidden size: drafter 64, target 32"), std::string::npos) << text;
  EXPECT_NE(text.find("FAIL  vocabulary: drafter vocab_size 256, target embedding rows 16"), std::string::npos) << text;
  EXPECT_NE(text.find("FAIL  num_target_layers"), std::string::npos) << text;
  EXPECT_NE(text.find("FAIL  mask token id"), std::string::npos) << text;
  EXPECT_NE(text.find("result: FAIL"), std::string::npos) << text;
  // The drafter itself is sound: its failures are the pairing's, not its checkpoint's.
  EXPECT_EQ(line(p, "drafter checkpoint")->status, PairingLine::Status::Pass);
  EXPECT_FALSE(p.to_json()["ok"].get<bool>());
}

TEST(InspectPairingMismatch, TargetThatIsNotATarget) {
  const PairingReport p = inspect_pairing(tiny("dflash-qwen3-gqa4-untied-f32"), tiny("dflash-qwen3-gqa1-tied-f32"));
  EXPECT_FALSE(p.ok());
  EXPECT_EQ(line(p, "target checkpoint")->status, PairingLine::Status::Fail);
}

TEST(InspectPairingMismatch, MissingDirectoryIsAFailNotAThrow) {
  const PairingReport p = inspect_pairing("/nonexistent/drafter", tiny("qwen3-gqa4-untied-f32"));
  EXPECT_FALSE(p.ok());
  ASSERT_NE(line(p, "drafter checkpoint"), nullptr);
  EXPECT_NE(line(p, "drafter checkpoint")->detail.find("not a model directory"), std::string::npos);
}

// --- config disagreements ---------------------------------------------------------------

struct InspectDisagreement : ::testing::Test {
  TempDir dir{"inspect"};
  std::string target_with(const char* name, const std::function<void(json&)>& edit) {
    copy_dir(tiny(name), dir.path());
    json c = read_json_file(dir.file("config.json"));
    edit(c);
    write_bytes(dir.file("config.json"), c.dump(2));
    return dir.path();
  }
};

TEST_F(InspectDisagreement, IntermediateSizeDisagreesWithTheShapes) {
  const InspectReport r = inspect_checkpoint(target_with("qwen3-gqa4-untied-f32", [](json& c) { c["intermediate_size"] = 128; }));
  EXPECT_FALSE(r.ok());
  // gate, up and down in each of the 3 layers.
  ASSERT_EQ(r.agreement.findings.size(), 9u) << r.to_text(false);
  for (const auto& f : r.agreement.findings) EXPECT_EQ(f.kind, ShapeFinding::Kind::Mismatch) << f.describe();
  const std::string text = r.to_text(false);
  EXPECT_NE(text.find("config agreement: FAIL (9 disagreements)"), std::string::npos) << text;
  EXPECT_NE(text.find("tensor 'model.layers.0.mlp.gate_proj.weight' has shape [160, 64], config implies [128, 64]"),
            std::string::npos) << text;
  EXPECT_FALSE(r.to_json()["config_agreement"]["ok"].get<bool>());
}

TEST_F(InspectDisagreement, LayerCountAndTyingDisagree) {
  // One layer too many (its tensors are missing) and untied (lm_head is missing).
  const InspectReport r = inspect_checkpoint(target_with("qwen3-gqa1-tied-f32", [](json& c) {
    c["num_hidden_layers"] = 3;
    c["tie_word_embeddings"] = false;
  }));
  EXPECT_FALSE(r.ok());
  std::set<std::string> missing;
  for (const auto& f : r.agreement.findings) {
    EXPECT_EQ(f.kind, ShapeFinding::Kind::Missing) << f.describe();
    missing.insert(f.name);
  }
  EXPECT_EQ(missing.size(), 12u);
  EXPECT_TRUE(missing.count("lm_head.weight"));
  EXPECT_TRUE(missing.count("model.layers.2.mlp.down_proj.weight"));
}

TEST_F(InspectDisagreement, TooFewLayersLeavesUnexpectedTensors) {
  const InspectReport r = inspect_checkpoint(target_with("qwen3-gqa4-untied-f32", [](json& c) { c["num_hidden_layers"] = 2; }));
  ASSERT_EQ(r.agreement.findings.size(), 11u);
  for (const auto& f : r.agreement.findings) {
    EXPECT_EQ(f.kind, ShapeFinding::Kind::Unexpected);
    EXPECT_EQ(f.name.rfind("model.layers.2.", 0), 0u) << f.name;
  }
}

TEST_F(InspectDisagreement, InvalidConfigIsReportedNotThrown) {
  const InspectReport r = inspect_checkpoint(target_with("qwen3-gqa4-untied-f32", [](json& c) { c["hidden_size"] = "wide"; }));
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.agreement.error.find("field 'hidden_size' must be an integer"), std::string::npos) << r.agreement.error;
  // The tensor table is still there.
  EXPECT_EQ(r.tensors.size(), 36u);
}

TEST_F(InspectDisagreement, DrafterConfigDisagreesWithItsShapes) {
  copy_dir(tiny("dflash-qwen3-gqa4-untied-f32"), dir.path());
  json c = read_json_file(dir.file("config.json"));
  c["num_key_value_heads"] = 4;
  write_bytes(dir.file("config.json"), c.dump());
  const InspectReport r = inspect_checkpoint(dir.path());
  EXPECT_FALSE(r.ok());
  std::set<std::string> names;
  for (const auto& f : r.agreement.findings) names.insert(f.name);
  EXPECT_EQ(names, (std::set<std::string>{"layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight"}));
  const PairingReport p = inspect_pairing(dir.path(), tiny("qwen3-gqa4-untied-f32"));
  EXPECT_FALSE(p.ok());
  EXPECT_EQ(line(p, "drafter checkpoint")->status, PairingLine::Status::Fail);
}

// Header-only: a checkpoint whose data would be gigabytes inspects without reading it.
TEST_F(InspectDisagreement, BigSparseCheckpointReadsOnlyTheHeader) {
  const int64_t V = 151936, H = 4096;
  json h = {{"model.embed_tokens.weight", {{"dtype", "BF16"}, {"shape", {V, H}}, {"data_offsets", {0, V * H * 2}}}}};
  const std::string header = safetensors_bytes(h, "");
  write_bytes(dir.file("model.safetensors"), header);
  std::filesystem::resize_file(dir.file("model.safetensors"), header.size() + uint64_t(V * H * 2));
  const InspectReport r = inspect_checkpoint(dir.path());
  EXPECT_EQ(r.parameters, V * H);
  EXPECT_EQ(r.bytes, uint64_t(V * H * 2));
  EXPECT_EQ(r.kind, ModelKind::Qwen3Target);
  EXPECT_FALSE(r.ok());  // no config.json to agree with
}

// --- drafters without config.json ---------------------------------------------------------

// Draft logits after a short prompt: the drafter's whole input path (features, fc, cache, block).
std::vector<float> test_draft_logits(Backend& backend, DFlashDrafter& d, Qwen3Model& t) {
  SequenceState ts = t.new_sequence(64), ds = d.new_sequence(64);
  ForwardOutput out = t.forward(ts, {3, 17, 42, 7, 99, 1}, false, d.config().target_layer_ids);
  d.add_context(ds, out.features);
  Tensor logits = d.draft(ds, 5, d.config().block_size);
  std::vector<float> v(size_t(logits.rows * logits.cols));
  backend.download(logits, v.data());
  return v;
}

struct InspectNoConfig : ::testing::Test {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  TempDir dir{"inspect-nocfg"};
  TempDir tdir{"inspect-target"};
  const std::string drafter = tiny("dflash-qwen3-gqa4-untied-f32");
  const std::string target = tiny("qwen3-gqa4-untied-f32");
  InspectNoConfig() {
    copy_dir(drafter, dir.path());
    std::filesystem::remove(dir.file("config.json"));
    std::filesystem::remove(dir.file("drafter_golden.json"));
  }
  // The target with a tokenizer that defines ids 0 … 254, so the mask id can be derived (255).
  std::string target_with_tokenizer() {
    copy_dir(target, tdir.path());
    json vocab = json::object();
    for (int i = 0; i < 255; ++i) vocab[std::string("t").append(std::to_string(i))] = i;  // (GCC 12 -Wrestrict false positive on "t" + string)
    write_bytes(tdir.file("tokenizer.json"),
                json({{"model", {{"type", "BPE"}, {"vocab", vocab}}}, {"added_tokens", json::array()}}).dump());
    return tdir.path();
  }
  std::vector<float> draft_logits(DFlashDrafter& d, Qwen3Model& t) { return test_draft_logits(*backend, d, t); }
};

TEST_F(InspectNoConfig, ShapesGiveTheArchitectureAndTheRestIsUnknown) {
  const InspectReport r = inspect_checkpoint(dir.path());
  EXPECT_EQ(r.kind, ModelKind::DFlashDrafter);
  EXPECT_FALSE(r.has_config);
  ASSERT_TRUE(r.drafter && r.drafter->config_valid);
  EXPECT_EQ(field(r, "hidden_size").value, 64);
  EXPECT_EQ(field(r, "hidden_size").source, "shapes");
  EXPECT_EQ(field(r, "num_hidden_layers").value, 1);
  EXPECT_EQ(field(r, "num_attention_heads").value, 8);
  EXPECT_EQ(field(r, "num_key_value_heads").value, 2);
  EXPECT_EQ(field(r, "head_dim").value, 32);
  EXPECT_EQ(field(r, "intermediate_size").value, 160);
  EXPECT_EQ(r.drafter->fc_cols, 128);
  EXPECT_EQ(r.drafter->k, 2);  // 128 / the drafter's own 64, stated as an assumption
  EXPECT_NE(r.drafter->k_note.find("ASSUMED target hidden size = drafter hidden size"), std::string::npos);
  for (const char* f : {"target_layer_ids", "mask_token_id", "vocab_size", "num_target_layers"}) {
    EXPECT_EQ(field(r, f).source, "unknown") << f;
    EXPECT_TRUE(field(r, f).value.is_null()) << f;
  }
  EXPECT_EQ(field(r, "block_size").source, "default");
  EXPECT_EQ(field(r, "block_size").value, 16);
  EXPECT_TRUE(r.ok()) << r.to_text(false);
}

TEST_F(InspectNoConfig, WithTheTargetTheDefaultsAreFilledAndMarked) {
  InspectOptions opt;
  opt.target_dir = target_with_tokenizer();
  const InspectReport r = inspect_checkpoint(dir.path(), opt);
  EXPECT_EQ(field(r, "target_layer_ids").value, json({1, 0}));  // round(1 + i·(3−4)/1), K = 2
  EXPECT_EQ(field(r, "target_layer_ids").source, "default");
  EXPECT_EQ(field(r, "mask_token_id").value, 255);
  EXPECT_EQ(field(r, "mask_token_id").source, "default");
  EXPECT_EQ(field(r, "vocab_size").source, "target");
  EXPECT_EQ(field(r, "num_target_layers").value, 3);
}

TEST_F(InspectNoConfig, WrittenConfigWithOverridesReloadsBitIdentically) {
  InspectOptions opt;
  opt.target_dir = target;
  opt.target_layer_ids = std::vector<int>{0, 1};
  opt.mask_token_id = 255;
  opt.block_size = 16;
  write_drafter_config(dir.path(), opt, dir.file("config.json"));
  const json written = read_json_file(dir.file("config.json"));
  EXPECT_EQ(written["dflash_config"]["target_layer_ids"], json({0, 1}));
  const auto guessed = written["dflash_guessed_fields"].get<std::vector<std::string>>();
  for (const char* f : {"target_layer_ids", "mask_token_id", "block_size"})
    EXPECT_EQ(std::count(guessed.begin(), guessed.end(), f), 0) << f << " was given, not guessed";

  auto t = Qwen3Model::load(target, *backend);
  auto original = DFlashDrafter::load(drafter, *t);
  std::vector<std::string> warnings;
  auto rebuilt = DFlashDrafter::load(dir.path(), *t, &warnings);
  // The loader repeats only what the written config lists as guessed, never the given fields.
  ASSERT_EQ(warnings.size(), guessed.size());
  for (const auto& w : warnings) {
    EXPECT_NE(w.find("(guessed when this config was written)"), std::string::npos) << w;
    for (const char* f : {"target_layer_ids", "mask_token_id", "block_size"}) EXPECT_EQ(w.find(f), std::string::npos) << w;
  }
  EXPECT_EQ(rebuilt->config().target_layer_ids, original->config().target_layer_ids);
  EXPECT_EQ(rebuilt->config().layers.rope, original->config().layers.rope);
  const auto a = draft_logits(*original, *t), b = draft_logits(*rebuilt, *t);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "draft logits differ";

  // Inspecting the written config: stated now, everything agrees, the pairing passes.
  const InspectReport r = inspect_checkpoint(dir.path());
  EXPECT_TRUE(r.ok()) << r.to_text(false);
  EXPECT_EQ(field(r, "target_layer_ids").source, "config.json");
  EXPECT_TRUE(inspect_pairing(dir.path(), target).ok());
}

TEST_F(InspectNoConfig, WrittenConfigWithoutOverridesMarksTheGuesses) {
  InspectOptions opt;
  opt.target_dir = target_with_tokenizer();
  write_drafter_config(dir.path(), opt, dir.file("config.json"));
  const json written = read_json_file(dir.file("config.json"));
  const auto guessed = written["dflash_guessed_fields"].get<std::vector<std::string>>();
  for (const char* f : {"target_layer_ids", "mask_token_id", "block_size"})
    EXPECT_EQ(std::count(guessed.begin(), guessed.end(), f), 1) << f;
  EXPECT_EQ(written["dflash_config"]["target_layer_ids"], json({1, 0}));  // not the real [0, 1]
  EXPECT_EQ(written["dflash_config"]["mask_token_id"], 255);
  EXPECT_EQ(written["hidden_size"], 64);
  EXPECT_EQ(written["dflash_inferred_fields"]["hidden_size"], "shapes");

  // The engine loads it; the pairing report warns about the guesses instead of passing silently.
  auto t = Qwen3Model::load(opt.target_dir, *backend);
  auto d = DFlashDrafter::load(dir.path(), *t);
  EXPECT_EQ(d->config().target_layer_ids, (std::vector<int>{1, 0}));
  const PairingReport p = inspect_pairing(dir.path(), opt.target_dir);
  EXPECT_TRUE(p.ok()) << p.to_text();
  ASSERT_NE(line(p, "drafter config"), nullptr);
  EXPECT_EQ(line(p, "drafter config")->status, PairingLine::Status::Warn);
  EXPECT_NE(line(p, "drafter config")->detail.find("target_layer_ids (marked guessed in config.json)"), std::string::npos)
      << line(p, "drafter config")->detail;
}

TEST_F(InspectNoConfig, MaskIdThatCannotBeGuessedIsRefused) {
  InspectOptions opt;
  opt.target_dir = target;  // no tokenizer.json
  const auto msg = error_of([&] { drafter_config_json(dir.path(), opt); });
  EXPECT_NE(msg.find("field 'mask_token_id' is not stated and cannot be derived"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--mask-token-id"), std::string::npos) << msg;
  // The pairing report says the same as a FAIL.
  const PairingReport p = inspect_pairing(dir.path(), target);
  EXPECT_FALSE(p.ok());
  EXPECT_EQ(line(p, "drafter config")->status, PairingLine::Status::Fail);
}

TEST_F(InspectNoConfig, WriteConfigNeedsTheTarget) {
  const auto msg = error_of([&] { drafter_config_json(dir.path(), {}); });
  EXPECT_NE(msg.find("needs its target (--target)"), std::string::npos) << msg;
}

// --- the shipped code pair, once it exists ------------------------------------------------

TEST(InspectRealPair, PycodeTargetAndDrafter) {
  const std::string t = source_path("models/qwen3-pycode-15m"), d = source_path("models/qwen3-pycode-15m-dflash");
  if (!std::filesystem::exists(t + "/config.json") || !std::filesystem::exists(d))
    GTEST_SKIP() << "models/qwen3-pycode-15m(-dflash) not present";
  const InspectReport tr = inspect_checkpoint(t);
  EXPECT_EQ(tr.kind, ModelKind::Qwen3Target);
  EXPECT_TRUE(tr.ok()) << tr.to_text(false);
  EXPECT_EQ(tr.parameters, independent_parameter_count(t));
  const InspectReport dr = inspect_checkpoint(d);
  EXPECT_EQ(dr.kind, ModelKind::DFlashDrafter);
  EXPECT_TRUE(dr.ok()) << dr.to_text(false);
  const PairingReport p = inspect_pairing(d, t);
  EXPECT_TRUE(p.ok()) << p.to_text();
  for (const auto& l : p.lines) EXPECT_EQ(l.status, PairingLine::Status::Pass) << l.what << ": " << l.detail;

  // Published without its config: the target's tokenizer gives the right mask id, the layer
  // ids are a guess (the publisher's formula gives [1, 3, 5] for L = 8, K = 3; the drafter was
  // trained on [1, 4, 6]); with the true ids given, the rebuilt config drafts bit-identically.
  TempDir dir("inspect-pycode");
  copy_dir(d, dir.path());
  std::filesystem::remove(dir.file("config.json"));
  InspectOptions opt;
  opt.target_dir = t;
  const json guessed = drafter_config_json(dir.path(), opt);
  EXPECT_EQ(guessed["dflash_config"]["mask_token_id"], read_json_file(d + "/config.json")["dflash_config"]["mask_token_id"]);
  EXPECT_EQ(guessed["dflash_config"]["target_layer_ids"], json({1, 3, 5}));
  const auto marked = guessed["dflash_guessed_fields"].get<std::vector<std::string>>();
  EXPECT_EQ(std::count(marked.begin(), marked.end(), "target_layer_ids"), 1);

  opt.target_layer_ids = read_json_file(d + "/config.json")["dflash_config"]["target_layer_ids"].get<std::vector<int>>();
  opt.block_size = 16;
  write_drafter_config(dir.path(), opt, dir.file("config.json"));
  auto backend = make_cpu_backend();
  auto target = Qwen3Model::load(t, *backend);
  auto original = DFlashDrafter::load(d, *target);
  auto rebuilt = DFlashDrafter::load(dir.path(), *target);
  const auto a = test_draft_logits(*backend, *original, *target), b = test_draft_logits(*backend, *rebuilt, *target);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "draft logits differ";
}

}  // namespace

// --- fixes found by tests/fuzz/fuzz_safetensors.cc ----------------------------------------

namespace {

TEST(InspectFuzzFindings, ControlCharactersInNamesStayOnOneLine) {
  const std::string bytes = safetensors_bytes(
      json{{"a\nforged line", {{"dtype", "I8"}, {"shape", {1}}, {"data_offsets", {0, 1}}}}}, std::string(1, '\0'));
  const auto msg = error_of([&] {
    parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "n.safetensors");
  });
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor 'a\\x0aforged line': unsupported dtype I8"), std::string::npos) << msg;
}

TEST(InspectFuzzFindings, HugeOrFractionalIntegersAreErrorsNotCasts) {
  json c = read_json_file(tiny("qwen3-gqa4-untied-f32") + "/config.json");
  c["vocab_size"] = 1e300;  // casting this to int was undefined behaviour
  auto msg = error_of([&] { parse_qwen3_config(c, "c.json"); });
  EXPECT_NE(msg.find("field 'vocab_size' must be an integer, got 1e+300"), std::string::npos) << msg;
  c["vocab_size"] = uint64_t(4294967297ull);  // used to wrap to 1
  msg = error_of([&] { parse_qwen3_config(c, "c.json"); });
  EXPECT_NE(msg.find("field 'vocab_size' is out of range, got 4294967297"), std::string::npos) << msg;
  c["vocab_size"] = 256.0;  // an integral float is still accepted
  EXPECT_EQ(parse_qwen3_config(c, "c.json").vocab_size, 256);
  msg = error_of([&] { parse_generation_config(json{{"eos_token_id", {1, int64_t(1) << 40}}}, "g.json"); });
  EXPECT_NE(msg.find("field 'eos_token_id' must hold integers"), std::string::npos) << msg;
}

TEST(InspectFuzzFindings, RopeTypeWithControlCharacters) {
  const auto msg = error_of([&] {
    parse_rope(json{{"rope_theta", 1e6}, {"rope_scaling", {{"rope_type", "x\ny"}, {"factor", 2.0}}}}, 512, "r.json");
  });
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_NE(msg.find("'x\\x0ay' is not supported"), std::string::npos) << msg;
}

}  // namespace
