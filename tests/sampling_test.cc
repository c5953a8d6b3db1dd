// The sampling warpers (temperature, top-k, top-p, min-p) against transformers' own warpers on
// the same logits (testdata/sampling/warpers_golden.json, made by tools/make_sampling_golden.py):
// the same tokens survive, with the same probabilities to f32 rounding. The cases cover top-p
// over the whole 32 000-token row and after top-k, and min-p.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>

#include "backend/backend.h"
#include "engine/acceptance.h"
#include "engine/logit_rows.h"
#include "engine/sampling.h"
#include "io/checkpoint.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::test;

namespace {

// The golden's logits (see the script): exact in double, then rounded to f32.
std::vector<float> golden_logits(int row, int vocab) {
  std::vector<float> l(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) {
    const uint64_t h = (uint64_t(i + 1) * 2654435761ULL + uint64_t(row) * 40503ULL) % (1ULL << 32);
    double u = double(h) / double(1ULL << 32);
    for (int s = 0; s < 6; ++s) u = u * u;
    l[size_t(i)] = static_cast<float>(30.0 * u - 5.0);
  }
  return l;
}

// A golden case's parameters, and the history its repetition penalty looks at (empty without).
struct GoldenCase {
  int row = 0;
  SamplingParams sp;
  std::vector<int32_t> history;
  std::string name() const {
    return "row " + std::to_string(row) + " T " + std::to_string(sp.temperature) + " top_k " +
           std::to_string(sp.top_k) + " top_p " + std::to_string(sp.top_p) + " min_p " + std::to_string(sp.min_p) +
           " repetition " + std::to_string(sp.repetition_penalty) + " biased " + std::to_string(sp.logit_bias.size());
  }
};

template <typename Json>
GoldenCase golden_case(const Json& c) {
  GoldenCase g;
  g.row = c["row"].template get<int>();
  g.sp.temperature = c["temperature"].template get<double>();
  g.sp.top_k = c["top_k"].template get<int>();
  g.sp.top_p = c["top_p"].template get<double>();
  g.sp.min_p = c["min_p"].template get<double>();
  if (c.contains("repetition_penalty")) {
    g.sp.repetition_penalty = c["repetition_penalty"].template get<double>();
    g.history = c["history"].template get<std::vector<int32_t>>();
  }
  if (c.contains("logit_bias"))
    for (const auto& b : c["logit_bias"])
      g.sp.logit_bias.emplace_back(b[0].template get<int32_t>(), b[1].template get<float>());
  return g;
}

TEST(SamplingWarpers, SameTokensAndProbabilitiesAsTransformers) {
  const auto g = read_json_file(source_path("testdata/sampling/warpers_golden.json"));
  const int vocab = g["vocab"].get<int>();
  ASSERT_GT(g["cases"].size(), 0u);
  int penalised = 0, biased = 0;
  for (const auto& c : g["cases"]) {
    const GoldenCase gc = golden_case(c);
    const SamplingParams& sp = gc.sp;
    SCOPED_TRACE(gc.name());
    penalised += !gc.history.empty();
    biased += !sp.logit_bias.empty();
    const auto logits = golden_logits(gc.row, vocab);
    const auto probs = token_distribution(logits.data(), vocab, sp, TokenHistory{&gc.history}).dense(vocab);
    std::vector<int32_t> kept;
    for (int i = 0; i < vocab; ++i) if (probs[size_t(i)] > 0) kept.push_back(i);
    const auto want = c["kept"].get<std::vector<int32_t>>();
    const auto want_p = c["probs"].get<std::vector<double>>();
    ASSERT_EQ(kept, want);
    for (size_t j = 0; j < want.size(); ++j)
      EXPECT_NEAR(probs[size_t(want[j])], want_p[j], 1e-6 + 2e-5 * want_p[j]) << "token " << want[j];
  }
  EXPECT_GE(penalised, 4) << "the golden has too few repetition-penalty cases";
  EXPECT_GE(biased, 2) << "the golden has too few logit-bias cases";
}

// Ties at the top-k threshold are all kept (transformers keeps every logit ≥ the k-th largest).
TEST(SamplingWarpers, TopKKeepsTiesAtTheThreshold) {
  std::vector<float> l = {1.f, 3.f, 2.f, 3.f, 2.f, 0.f};
  SamplingParams sp;
  sp.temperature = 1.0;
  sp.top_k = 3;
  const auto p = token_distribution(l.data(), int(l.size()), sp, TokenHistory{}).dense(int(l.size()));
  EXPECT_EQ(p[0], 0.f);
  EXPECT_GT(p[1], 0.f);
  EXPECT_GT(p[2], 0.f);
  EXPECT_GT(p[4], 0.f);
  EXPECT_EQ(p[5], 0.f);
  EXPECT_FLOAT_EQ(p[2], p[4]);
}

}  // namespace

namespace {

// The acceptance rule on supports: max(0, p − q) only where p exceeds q, whatever the two
// supports share, and p(d)/q(d) looked up by id.
TEST(AcceptanceRuleOnSupports, ResidualAndRatioAreTakenById) {
  const SupportLaw p(TokenDistribution{{2, 5, 9}, {0.5f, 0.3f, 0.2f}});
  const SupportLaw q(TokenDistribution{{1, 2, 9}, {0.4f, 0.6f, 0.0f}});
  EXPECT_EQ(p.prob(5), double(0.3f));
  EXPECT_EQ(p.prob(4), 0.0);
  EXPECT_EQ(q.prob(10), 0.0);
  const AcceptanceRule& rule = exact_acceptance_rule();
  Rng rng(7);
  std::map<int32_t, int> drawn;
  for (int i = 0; i < 4000; ++i) drawn[rule.replacement(p, q, rng)]++;
  // residual: token 2 → max(0, 0.5 − 0.6) = 0, token 5 → 0.3, token 9 → 0.2: 60 % / 40 %.
  EXPECT_EQ(drawn.count(1), 0u);
  EXPECT_EQ(drawn.count(2), 0u);
  EXPECT_NEAR(drawn[5] / 4000.0, 0.6, 0.03);
  EXPECT_NEAR(drawn[9] / 4000.0, 0.4, 0.03);
  // d = 1 has p(1) = 0: never accepted; d = 9 has q(9) = 0: never drawn from q, never accepted;
  // d = 2: accepted with probability 0.5 / 0.6.
  int accepted = 0;
  for (int i = 0; i < 4000; ++i) {
    EXPECT_FALSE(rule.accept(p, q, 1, rng));
    EXPECT_FALSE(rule.accept(p, q, 9, rng));
    accepted += rule.accept(p, q, 2, rng);
  }
  EXPECT_NEAR(accepted / 4000.0, 0.5 / 0.6, 0.03);
}

// Drawing from a support walks it in id order: the same token as the vocabulary-sized walk.
TEST(AcceptanceRuleOnSupports, DrawMatchesTheDenseWalk) {
  const TokenDistribution d{{3, 4, 17, 40}, {0.1f, 0.0f, 0.6f, 0.3f}};
  Rng a(11), b(11);
  for (int i = 0; i < 1000; ++i) {
    const std::vector<float> v = d.dense(64);
    double total = 0, acc = 0;
    for (float x : v) total += x;
    const double target = b.uniform() * total;
    int32_t want = 40;
    for (int t = 0; t < 64; ++t) {
      acc += v[size_t(t)];
      if (v[size_t(t)] > 0 && target < acc) {
        want = t;
        break;
      }
    }
    ASSERT_EQ(sample_from(d, a), want);
  }
}

}  // namespace

namespace {

// Top-p's candidates (select_top_p, what Backend::top_p_rows returns) and the row's mass give
// the whole row's distribution: the same tokens, probabilities to f32 rounding, on the
// golden's rows and on flat and peaked random rows.
TEST(TopPCandidates, GiveTheWholeRowsDistribution) {
  const auto g = read_json_file(source_path("testdata/sampling/warpers_golden.json"));
  const int vocab = g["vocab"].get<int>();
  std::vector<std::pair<std::vector<float>, SamplingParams>> cases;
  for (const auto& c : g["cases"]) {
    const GoldenCase gc = golden_case(c);
    if (gc.sp.top_k == 0 && gc.sp.top_p < 1.0 && !gc.sp.penalised()) cases.push_back({golden_logits(gc.row, vocab), gc.sp});
  }
  ASSERT_GT(cases.size(), 0u);
  Rng rng(3);
  for (double spread : {0.5, 4.0, 20.0})
    for (double top_p : {0.5, 0.9, 0.99}) {
      std::vector<float> l(5000);
      for (auto& v : l) v = static_cast<float>(spread * (rng.uniform() - 0.5));
      SamplingParams sp;
      sp.temperature = 0.7;
      sp.top_p = top_p;
      cases.push_back({l, sp});
    }
  for (const auto& [logits, sp] : cases) {
    const int n = static_cast<int>(logits.size());
    SCOPED_TRACE("vocab " + std::to_string(n) + " T " + std::to_string(sp.temperature) + " top_p " +
                 std::to_string(sp.top_p) + " min_p " + std::to_string(sp.min_p));
    const TokenDistribution whole = token_distribution(logits.data(), n, sp, TokenHistory{});
    CandidateRow c;
    select_top_p(logits.data(), n, static_cast<float>(1.0 / sp.temperature), static_cast<float>(sp.top_p), c);
    EXPECT_GT(c.row_mass, 0.0);
    EXPECT_GE(c.count, int(whole.ids.size()));
    const TokenDistribution from = distribution_of_candidates(c.ids, c.scaled, sp, c.row_mass);
    ASSERT_EQ(from.ids, whole.ids);
    for (size_t j = 0; j < whole.ids.size(); ++j) EXPECT_NEAR(from.probs[j], whole.probs[j], 1e-6f + 1e-5f * whole.probs[j]);
  }
}

}  // namespace

namespace {

// Temperature alone, top-p and min-p leave rows where they are (LogitRows' DeviceRows form and
// top-p laws, forced here on the CPU backend's defaults): a row with nothing finite is an error
// that says so, not a token −1.
TEST(DeviceRowLaws, ARowWithNothingFiniteIsAClearError) {
  auto cpu = make_cpu_backend();
  std::vector<float> row(8, -INFINITY);
  row[3] = NAN;
  Tensor logits = cpu->upload(row.data(), 1, 8);
  for (const auto& [top_p, min_p] : std::vector<std::pair<double, double>>{{1.0, 0.0}, {0.9, 0.0}, {1.0, 0.2}}) {
    SamplingParams sp;
    sp.temperature = 1.0;
    sp.top_p = top_p;
    sp.min_p = min_p;
    setenv("DFLASH_LOGIT_ROWS", "device", 1);
    LogitRows rows(*cpu, sp, 8);
    unsetenv("DFLASH_LOGIT_ROWS");
    rows.read(logits);
    Rng rng(1);
    try {
      rows.choose(0, rng);
      ADD_FAILURE() << "no error, top_p " << top_p << " min_p " << min_p;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no finite value"), std::string::npos) << e.what();
    }
  }
}

// row_laws rejects an id outside the vocabulary and more ids than rows, naming what was wrong,
// before it reads anything.
TEST(DeviceRowLaws, RowLawsRejectBadIds) {
  auto cpu = make_cpu_backend();
  const std::vector<float> host(2 * 8, 0.5f);
  Tensor logits = cpu->upload(host.data(), 2, 8);
  auto error_of = [&](const std::vector<int32_t>& ids) {
    try {
      cpu->row_laws(logits, 1.f, ids);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of({3, 8}).find("row_laws: id 8 of row 1 outside"), std::string::npos) << error_of({3, 8});
  EXPECT_NE(error_of({-1}).find("row_laws: id -1 of row 0"), std::string::npos) << error_of({-1});
  EXPECT_NE(error_of({0, 1, 2}).find("row_laws: 3 ids for"), std::string::npos) << error_of({0, 1, 2});
  EXPECT_EQ(cpu->row_laws(logits, 1.f, {7, 0}).scaled.size(), 2u);
}

// A block's drafts drawn in one call (choose_rows) are the tokens of one draw a row from the
// same generator, and the drawn tokens' probabilities and those fetched by look_up are the
// ones the laws compute on their own.
TEST(DeviceRowLaws, ABlockDrawnInOneCallIsTheSingleDrawsTokens) {
  auto cpu = make_cpu_backend();
  const int rows = 6, vocab = 300;
  std::vector<float> host;
  for (int r = 0; r < rows; ++r) {
    const auto l = golden_logits(r, vocab);
    host.insert(host.end(), l.begin(), l.end());
  }
  Tensor logits = cpu->upload(host.data(), rows, vocab);
  SamplingParams sp;
  sp.temperature = 0.7;
  setenv("DFLASH_LOGIT_ROWS", "device", 1);
  LogitRows block(*cpu, sp, vocab), single(*cpu, sp, vocab), fresh(*cpu, sp, vocab);
  unsetenv("DFLASH_LOGIT_ROWS");
  for (int round = 0; round < 20; ++round) {
    block.read(logits);
    single.read(logits);
    fresh.read(logits);
    Rng a(100 + round), b(100 + round);
    std::vector<int32_t> drawn(rows), again(rows);
    block.choose_rows(drawn.data(), rows, a);
    for (int r = 0; r < rows; ++r) {
      ASSERT_EQ(drawn[size_t(r)], single.law(r).draw(b)) << "round " << round << ", row " << r;
      EXPECT_EQ(block.law(r).prob(drawn[size_t(r)]), fresh.law(r).prob(drawn[size_t(r)]));
      again[size_t(r)] = (drawn[size_t(r)] + 7 * r + 1) % vocab;  // other ids, fetched in one call
    }
    EXPECT_EQ(a.uniform(), b.uniform()) << "the block took another number of uniforms";
    single.look_up(again.data(), rows);
    for (int r = 0; r < rows; ++r)
      EXPECT_EQ(single.law(r).prob(again[size_t(r)]), fresh.law(r).prob(again[size_t(r)]));
  }
}

}  // namespace

namespace {

// A drafted block's rows drawn in one call (choose_rows, which builds the laws of rows read whole
// on every core first) are the tokens of one draw a row from the same generator, and the laws
// built at once are those built one by one: flat rows, whose top-p nucleus is over the
// device's candidate cap and so read whole, between peaked rows that come as candidates; and
// the forms that read every row whole.
TEST(LogitRowsBlock, LawsBuiltTogetherDrawTheSingleDrawsTokens) {
  auto cpu = make_cpu_backend();
  const int rows = 6, vocab = 100000;  // big enough rows for the threads (logit_rows.cc)
  std::vector<float> host;
  Rng fill(9);
  for (int r = 0; r < rows; ++r) {
    if (r % 2 == 0) {
      for (int i = 0; i < vocab; ++i) host.push_back(static_cast<float>(0.5 * fill.uniform()));
    } else {
      const auto l = golden_logits(r, vocab);
      host.insert(host.end(), l.begin(), l.end());
    }
  }
  Tensor logits = cpu->upload(host.data(), rows, vocab);
  SamplingParams top_p, min_p, wide_k;
  top_p.temperature = 0.7;
  top_p.top_p = 0.9;
  min_p.temperature = 1.0;
  min_p.min_p = 0.05;
  wide_k.temperature = 0.8;
  wide_k.top_k = 3000;  // past the device's top-k buffer: rows read whole
  for (const SamplingParams& sp : {top_p, min_p, wide_k}) {
    SCOPED_TRACE("top_p " + std::to_string(sp.top_p) + " min_p " + std::to_string(sp.min_p) + " top_k " +
                 std::to_string(sp.top_k));
    LogitRows block(*cpu, sp, vocab), single(*cpu, sp, vocab);
    for (int round = 0; round < 2; ++round) {
      block.read(logits);
      single.read(logits);
      Rng a(200 + round), b(200 + round);
      std::vector<int32_t> drawn(rows);
      block.choose_rows(drawn.data(), rows, a);
      for (int r = 0; r < rows; ++r) {
        const TokenLaw& one = single.law(r);
        ASSERT_EQ(drawn[size_t(r)], one.draw(b)) << "round " << round << ", row " << r;
        const auto& built = dynamic_cast<const SupportLaw&>(block.law(r)).distribution();
        const auto& alone = dynamic_cast<const SupportLaw&>(one).distribution();
        EXPECT_EQ(built.ids, alone.ids) << "row " << r;
        EXPECT_EQ(built.probs, alone.probs) << "row " << r;
        if (r % 2 == 0 && sp.top_p < 1.0) {
          EXPECT_GT(built.ids.size(), 2048u) << "row " << r << " should be over the cap";
        }
      }
      EXPECT_EQ(a.uniform(), b.uniform()) << "the block took another number of uniforms";
    }
  }
}

}  // namespace

namespace {

// Rows whose top-p nucleus stays on the device (Backend::top_p_laws; here the CPU backend's
// default, which the GPU's cuts must equal): flat rows, peaked rows, runs of equal logits, with
// a −inf among them.
std::vector<float> top_p_test_row(int kind, int vocab, Rng& fill) {
  std::vector<float> row(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) {
    const double u = fill.uniform();
    row[size_t(i)] = kind == 0 ? static_cast<float>(0.5 * u)                    // flat
                     : kind == 1 ? static_cast<float>(std::floor(6.0 * u) * 0.5)  // ties
                                 : static_cast<float>(30.0 * std::pow(u, 12.0));  // peaked
  }
  row[size_t(vocab / 2)] = -INFINITY;  // (NaN has no place in the whole row's softmax to compare with)
  return row;
}

// The tokens a law admits, ascending, and their probabilities.
TokenDistribution admitted(const RowLaw& law, const std::vector<float>& row, float inv_t) {
  TokenDistribution d;
  for (size_t i = 0; i < row.size(); ++i) {
    const float s = row[i] * inv_t;
    if (std::isnan(s) || s == -INFINITY || !law.admits(s, int32_t(i))) continue;
    d.ids.push_back(int32_t(i));
    d.probs.push_back(static_cast<float>(std::exp(double(s) - double(law.max)) / law.mass));
  }
  return d;
}

// The law keeps the tokens the whole row's top-p keeps (token_distribution, which the warper
// golden holds to transformers), with their probabilities, and its mass is the sum of what it
// keeps. The cut is found on fixed-point weights, the reference on f32 probabilities, so a row
// could part on a token whose tail mass is within rounding of 1 − top_p; these rows do not.
// The laws against transformers' own warpers (the golden of SamplingWarpers): every case
// without top-k keeps transformers' tokens with its probabilities.
TEST(TopPLaws, KeepTransformersTokens) {
  auto cpu = make_cpu_backend();
  const auto g = read_json_file(source_path("testdata/sampling/warpers_golden.json"));
  const int vocab = g["vocab"].get<int>();
  int cases = 0;
  for (const auto& c : g["cases"]) {
    const double top_p = c["top_p"].get<double>(), min_p = c["min_p"].get<double>();
    if (c["top_k"].get<int>() != 0 || (top_p >= 1.0 && min_p == 0.0) || golden_case(c).sp.penalised()) continue;
    const int row = c["row"].get<int>();
    const float inv_t = static_cast<float>(1.0 / c["temperature"].get<double>());
    SCOPED_TRACE("row " + std::to_string(row) + " top_p " + std::to_string(top_p) + " min_p " + std::to_string(min_p));
    const auto logits = golden_logits(row, vocab);
    Tensor t = cpu->upload(logits.data(), 1, vocab);
    const RowLaw law = cpu->top_p_laws(t, inv_t, static_cast<float>(top_p), static_cast<float>(min_p))[0];
    const TokenDistribution got = admitted(law, logits, inv_t);
    const auto want = c["kept"].get<std::vector<int32_t>>();
    const auto want_p = c["probs"].get<std::vector<double>>();
    ASSERT_EQ(got.ids, want);
    for (size_t j = 0; j < want.size(); ++j)
      EXPECT_NEAR(got.probs[j], want_p[j], 1e-6 + 2e-5 * want_p[j]) << "token " << want[j];
    ++cases;
  }
  EXPECT_GE(cases, 2) << "the golden has too few top-p and min-p cases without top-k";
}

TEST(TopPLaws, KeepTheWholeRowsNucleus) {
  auto cpu = make_cpu_backend();
  const int vocab = 20000;
  Rng fill(31);
  for (int kind = 0; kind < 3; ++kind)
    for (const auto& [top_p, min_p] : std::vector<std::pair<double, double>>{
             {0.5, 0.0}, {0.9, 0.0}, {0.99, 0.0}, {1.0, 0.05}, {1.0, 0.6}, {0.9, 0.3}, {0.5, 0.9}})
      for (double temperature : {0.7, 1.0}) {
        SCOPED_TRACE("kind " + std::to_string(kind) + " top_p " + std::to_string(top_p) + " min_p " +
                     std::to_string(min_p) + " T " + std::to_string(temperature));
        const std::vector<float> row = top_p_test_row(kind, vocab, fill);
        SamplingParams sp;
        sp.temperature = temperature;
        sp.top_p = top_p;
        sp.min_p = min_p;
        const float inv_t = static_cast<float>(1.0 / temperature);
        Tensor logits = cpu->upload(row.data(), 1, vocab);
        const RowLaw law = cpu->top_p_laws(logits, inv_t, static_cast<float>(top_p), static_cast<float>(min_p))[0];
        const TokenDistribution want = token_distribution(row.data(), vocab, sp, TokenHistory{});
        const TokenDistribution got = admitted(law, row, inv_t);
        ASSERT_EQ(got.ids, want.ids);
        double sum = 0;
        for (size_t j = 0; j < want.ids.size(); ++j) {
          EXPECT_NEAR(got.probs[j], want.probs[j], 2e-6 * want.probs[j]) << "token " << want.ids[j];
          sum += got.probs[j];
        }
        EXPECT_NEAR(sum, 1.0, 1e-5);
        if (kind == 1 && top_p == 0.9 && min_p == 0.0) {
          EXPECT_GT(law.cut_id, 0) << "this row's cut should fall inside a run of ties";
        }
      }
}

// (Drawing from such a row is DeviceRowLaws.ARowWithNothingFiniteIsAClearError.)
TEST(TopPLaws, ARowWithNothingFiniteAdmitsNothing) {
  auto cpu = make_cpu_backend();
  std::vector<float> row(8, -INFINITY);
  row[3] = NAN;
  Tensor logits = cpu->upload(row.data(), 1, 8);
  for (const auto& [top_p, min_p] : std::vector<std::pair<float, float>>{{0.9f, 0.f}, {1.f, 0.2f}, {0.5f, 0.5f}}) {
    const RowLaw law = cpu->top_p_laws(logits, 1.f, top_p, min_p)[0];
    EXPECT_EQ(law.mass, 0.0);
    EXPECT_TRUE(admitted(law, row, 1.f).ids.empty());
  }
}

TEST(TopPLaws, ATopPOrMinPOutsideItsRangeIsAnError) {
  auto cpu = make_cpu_backend();
  const std::vector<float> row(8, 0.5f);
  Tensor logits = cpu->upload(row.data(), 1, 8);
  auto error_of = [&](float top_p, float min_p) {
    try {
      cpu->top_p_laws(logits, 1.f, top_p, min_p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (float bad : {0.f, 1.5f, -0.5f, NAN})
    EXPECT_NE(error_of(bad, 0.f).find("top_p_laws: top_p"), std::string::npos) << error_of(bad, 0.f);
  for (float bad : {-0.1f, 1.5f, NAN})
    EXPECT_NE(error_of(0.9f, bad).find("top_p_laws: min_p"), std::string::npos) << error_of(0.9f, bad);
  EXPECT_EQ(error_of(1.f, 0.f), "no error");
}

// Top-p rows left where they are (forced on the CPU backend): a block drawn in one call is the
// single draws' tokens, p(d) fetched by look_up is the law's own, and the excess of a row left
// in place over a row that came as candidates (the two kinds a step can mix) is drawn on the
// host from max(0, p − q), which is 0 wherever q covers p.
TEST(TopPLaws, RowsLeftInPlaceDrawAsTheirLawsSay) {
  auto cpu = make_cpu_backend();
  const int rows = 5, vocab = 6000;
  Rng fill(77);
  std::vector<float> host;
  for (int r = 0; r < rows; ++r) {
    const auto row = top_p_test_row(r % 3, vocab, fill);
    host.insert(host.end(), row.begin(), row.end());
  }
  Tensor logits = cpu->upload(host.data(), rows, vocab);
  SamplingParams sp;
  sp.temperature = 0.8;
  sp.top_p = 0.9;
  setenv("DFLASH_LOGIT_ROWS", "device", 1);
  LogitRows block(*cpu, sp, vocab), single(*cpu, sp, vocab);
  unsetenv("DFLASH_LOGIT_ROWS");
  LogitRows candidates(*cpu, sp, vocab);  // the default form on the host: supports
  for (int round = 0; round < 10; ++round) {
    block.read(logits);
    single.read(logits);
    candidates.read(logits);
    Rng a(300 + round), b(300 + round);
    std::vector<int32_t> drawn(rows), other(rows);
    block.choose_rows(drawn.data(), rows, a);
    for (int r = 0; r < rows; ++r) {
      ASSERT_EQ(drawn[size_t(r)], single.law(r).draw(b)) << "round " << round << ", row " << r;
      const double want = candidates.law(r).prob(drawn[size_t(r)]);
      EXPECT_GT(want, 0.0) << "drawn outside the nucleus";
      EXPECT_NEAR(block.law(r).prob(drawn[size_t(r)]), want, 2e-6 * want);
      other[size_t(r)] = (drawn[size_t(r)] + 13 * r + 1) % vocab;
    }
    EXPECT_EQ(a.uniform(), b.uniform()) << "the block took another number of uniforms";
    single.look_up(other.data(), rows);
    for (int r = 0; r < rows; ++r) {
      const double want = candidates.law(r).prob(other[size_t(r)]);
      EXPECT_NEAR(single.law(r).prob(other[size_t(r)]), want, 2e-6 * want + 1e-12);
    }
    for (int r = 0; r + 1 < rows; ++r) {
      const TokenLaw &p = block.law(r), &q = candidates.law(r + 1);
      const int32_t t = p.draw_excess_over(q, a);
      ASSERT_GE(t, 0);
      EXPECT_GT(p.prob(t), q.prob(t)) << "row " << r;
      EXPECT_EQ(q.draw_excess_over(p, b) >= 0, true) << "row " << r;
    }
  }
}

}  // namespace

namespace {

// A causal block's penalty histories: a prompt and an output that share tokens (one outside
// the vocabulary, skipped), drafts that repeat both and one another.
struct PenaltyBlock {
  std::vector<int32_t> prompt = {7, 11, 11, 2999, 40, 5000, -3};
  std::vector<int32_t> output = {40, 41, 7, 100, 41};
  std::vector<int32_t> drafts = {11, 41, 500, 500, 100};  // 41 a third time, 500 twice
  TokenHistory block() const { return {&prompt, &output, drafts.data(), int(drafts.size())}; }
  TokenHistory row(int r) const { return {&prompt, &output, drafts.data(), std::min(r, int(drafts.size()))}; }
};

std::vector<float> penalty_test_rows(int rows, int vocab) {
  Rng fill(5);
  std::vector<float> host(size_t(rows) * vocab);
  for (auto& v : host) v = static_cast<float>(8.0 * (fill.uniform() - 0.5));
  host[7] = 0.f;                         // a zero: divided and multiplied alike
  host[size_t(vocab) + 7] = -0.f;
  host[size_t(2 * vocab) + 11] = -INFINITY;
  return host;
}

// The tokens of positive probability (a whole row's support lists a −inf token with 0).
TokenDistribution nonzero(const TokenDistribution& d) {
  TokenDistribution out;
  for (size_t j = 0; j < d.ids.size(); ++j)
    if (d.probs[j] > 0) {
      out.ids.push_back(d.ids[j]);
      out.probs.push_back(d.probs[j]);
    }
  return out;
}

// (repetition, presence, frequency)
const std::vector<std::tuple<double, double, double>> kPenaltySettings = {
    {1.3, 0.0, 0.0}, {1.0, 0.7, 0.0}, {1.0, 0.0, 0.45}, {1.3, 0.7, 0.3}, {0.8, -0.5, -0.2}};

// Backend::apply_penalties (the CPU backend's here; the GPU's must equal it bit for bit)
// penalises row r of a block as apply_penalties penalises that row alone with row r's history:
// each penalty alone, both, and both below their neutral values.
TEST(Penalties, RowsPenalisedInPlaceAreTheHostsRows) {
  auto cpu = make_cpu_backend();
  const int rows = 6, vocab = 3000;
  const PenaltyBlock pb;
  const std::vector<float> host = penalty_test_rows(rows, vocab);
  for (const auto& [repetition, presence, frequency] : kPenaltySettings) {
    SCOPED_TRACE("repetition " + std::to_string(repetition) + " presence " + std::to_string(presence) + " frequency " +
                 std::to_string(frequency));
    SamplingParams sp;
    sp.repetition_penalty = repetition;
    sp.presence_penalty = presence;
    sp.frequency_penalty = frequency;
    // A logit bias beside each: on a prompt token, a drafted one, one of no history, and −100
    // (a ban) on an output token.
    if (frequency != 0.0) sp.logit_bias = {{11, 2.5f}, {500, -1.25f}, {1234, 7.f}, {40, -100.f}};
    Tensor t = cpu->upload(host.data(), rows, vocab);
    cpu->apply_penalties(t, penalty_tokens(sp, vocab, pb.block(), rows));
    std::vector<float> got(host.size());
    cpu->download(t, got.data());
    int changed = 0;
    for (int r = 0; r < rows; ++r) {
      std::vector<float> want(host.begin() + size_t(r) * vocab, host.begin() + size_t(r + 1) * vocab);
      apply_penalties(want.data(), vocab, sp, pb.row(r));
      ASSERT_EQ(std::memcmp(want.data(), got.data() + size_t(r) * vocab, want.size() * sizeof(float)), 0) << "row " << r;
      for (int i = 0; i < vocab; ++i) changed += got[size_t(r) * vocab + i] != host[size_t(r) * vocab + i];
    }
    EXPECT_GT(changed, 5 * rows);
    // A draft's rows (no extra tokens): every row as row 0.
    Tensor d = cpu->upload(host.data(), rows, vocab);
    cpu->apply_penalties(d, penalty_tokens(sp, vocab, pb.row(0), rows));
    cpu->download(d, got.data());
    for (int r = 0; r < rows; ++r) {
      std::vector<float> want(host.begin() + size_t(r) * vocab, host.begin() + size_t(r + 1) * vocab);
      apply_penalties(want.data(), vocab, sp, pb.row(0));
      ASSERT_EQ(std::memcmp(want.data(), got.data() + size_t(r) * vocab, want.size() * sizeof(float)), 0) << "row " << r;
    }
  }
}

// A generation's penalties taken as its history grows (PenaltyHistory: only the new tokens each
// step) penalise every row as apply_penalties does with the whole history, through output that
// repeats the prompt, itself and the drafts, and again after it is handed another output.
TEST(Penalties, AGrowingHistoryPenalisesAsTheWholeHistory) {
  auto cpu = make_cpu_backend();
  const int rows = 5, vocab = 600;
  const std::vector<float> host = penalty_test_rows(rows, vocab);
  SamplingParams sp;
  sp.repetition_penalty = 1.3;
  sp.presence_penalty = 0.4;
  sp.frequency_penalty = 0.25;  // the output repeats its tokens: counts up to a dozen
  sp.logit_bias = {{50, 1.5f}, {80, -3.f}, {300, 4.f}};
  PenaltyHistory grown(sp, vocab);
  Rng pick(8);
  const std::vector<int32_t> prompt = {1, 2, 3, 3, 50, 599, 700};
  std::vector<int32_t> output, other(100);  // longer than the output it replaces: only its address tells
  for (size_t i = 0; i < other.size(); ++i) other[i] = int32_t(i % 7 == 0 ? 50 : 100 + i);
  auto penalised = [&](const PenaltyTokens& t) {
    Tensor x = cpu->upload(host.data(), rows, vocab);
    cpu->apply_penalties(x, t);
    std::vector<float> out(host.size());
    cpu->download(x, out.data());
    return out;
  };
  for (int step = 0; step < 40; ++step) {
    const bool another = step == 30;  // the same rows, another output from here on
    std::vector<int32_t>& out = another || step > 30 ? other : output;
    for (int k = 0; k < 1 + step % 3; ++k) out.push_back(int32_t(70 + pick.uniform() * 60));
    const std::vector<int32_t> drafts = {out.back(), 50, 50, int32_t(pick.uniform() * 60)};  // 50: prompt only
    const TokenHistory h{&prompt, &out, drafts.data(), int(drafts.size())};
    const std::vector<float> got = penalised(grown.tokens(h, rows));
    for (int r = 0; r < rows; ++r) {
      std::vector<float> want(host.begin() + size_t(r) * vocab, host.begin() + size_t(r + 1) * vocab);
      apply_penalties(want.data(), vocab, sp, TokenHistory{&prompt, &out, drafts.data(), std::min(r, 4)});
      ASSERT_EQ(std::memcmp(want.data(), got.data() + size_t(r) * vocab, want.size() * sizeof(float)), 0)
          << "step " << step << " row " << r;
    }
  }
}

TEST(Penalties, BadEntriesNameWhatIsWrong) {
  auto cpu = make_cpu_backend();
  const std::vector<float> row(8, 0.5f);
  Tensor logits = cpu->upload(row.data(), 1, 8);
  auto error_of = [&](PenaltyTokens t) {
    try {
      cpu->apply_penalties(logits, t);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  PenaltyTokens t;
  t.row_first = {0, 0};
  t.every_row = {PenaltyEntry{9, 1, 0.f}};
  EXPECT_NE(error_of(t).find("every_row entry 0: id 9 outside F32[1, 8]"), std::string::npos) << error_of(t);
  t.every_row = {PenaltyEntry{-1, 0, 0.5f}};
  EXPECT_NE(error_of(t).find("every_row entry 0: id -1 outside F32[1, 8]"), std::string::npos) << error_of(t);
  t.every_row = {};
  t.row_first = {0, 0, 0};
  EXPECT_NE(error_of(t).find("3 row offsets for F32[1, 8]"), std::string::npos) << error_of(t);
  t.row_first = {0, 1};
  EXPECT_NE(error_of(t).find("do not span the 0 own entries"), std::string::npos) << error_of(t);
  t.own.assign(PenaltyTokens::kMaxOwn + 1, PenaltyEntry{3, 0, 0.5f});
  t.row_first = {0, int32_t(t.own.size())};
  EXPECT_NE(error_of(t).find("row 0 has 65 own entries, more than 64"), std::string::npos) << error_of(t);
  t.row_first = {0, 1};
  t.own = {PenaltyEntry{3, 0, 0.5f}};
  EXPECT_EQ(error_of(t), "no error");
}

// Every form LogitRows reads rows in serves a request with penalties: the rows are penalised
// where they are, then each form gives the distribution of the whole row penalised on the host
// (token_distribution with the row's history), row by row of a causal block.
TEST(Penalties, EveryFormGivesThePenalisedRowsDistribution) {
  auto cpu = make_cpu_backend();
  const int rows = 6, vocab = 3000;
  const PenaltyBlock pb;
  const std::vector<float> host = penalty_test_rows(rows, vocab);
  SamplingParams greedy, top_k, top_p, min_p, alone, wide_k;
  top_k.temperature = 0.8, top_k.top_k = 40;
  top_p.temperature = 0.7, top_p.top_p = 0.9;
  min_p.temperature = 1.0, min_p.min_p = 0.05;
  alone.temperature = 1.2;
  wide_k.temperature = 0.9, wide_k.top_k = 2000;  // past the device's top-k buffer: rows read whole
  for (const char* env : {"", "device"})
    for (SamplingParams sp : {greedy, top_k, top_p, min_p, alone, wide_k}) {
      sp.repetition_penalty = 1.4;
      sp.presence_penalty = 0.6;
      sp.frequency_penalty = 0.3;
      sp.logit_bias = {{41, 3.f}, {2000, 9.f}, {17, -100.f}};
      SCOPED_TRACE(std::string("DFLASH_LOGIT_ROWS=") + env + " T " + std::to_string(sp.temperature) + " top_k " +
                   std::to_string(sp.top_k) + " top_p " + std::to_string(sp.top_p) + " min_p " +
                   std::to_string(sp.min_p));
      setenv("DFLASH_LOGIT_ROWS", env, 1);
      LogitRows lr(*cpu, sp, vocab);
      unsetenv("DFLASH_LOGIT_ROWS");
      Tensor t = cpu->upload(host.data(), rows, vocab);
      lr.read(t, pb.block());
      Rng rng(1);
      for (int r = 0; r < rows; ++r) {
        const TokenDistribution want =
            nonzero(token_distribution(host.data() + size_t(r) * vocab, vocab, sp, pb.row(r)));
        if (sp.greedy()) {
          EXPECT_EQ(lr.choose(r, rng), want.ids[0]) << "row " << r;
          continue;
        }
        const TokenDistribution got = nonzero(lr.law(r).support());
        ASSERT_EQ(got.ids, want.ids) << "row " << r;
        for (size_t j = 0; j < want.ids.size(); ++j)
          EXPECT_NEAR(got.probs[j], want.probs[j], 1e-5 * want.probs[j]) << "row " << r << " token " << want.ids[j];
      }
    }
}

// The repetition penalty and the logit bias against transformers' RepetitionPenaltyLogitsProcessor
// and SequenceBiasLogitsProcessor (the golden's penalty and bias cases) through LogitRows, the
// rows penalised by the backend, in the forms the CPU reads (candidates, whole rows) and those
// the GPU leaves on the device (forced here).
TEST(Penalties, KeepTransformersTokens) {
  auto cpu = make_cpu_backend();
  const auto g = read_json_file(source_path("testdata/sampling/warpers_golden.json"));
  const int vocab = g["vocab"].get<int>();
  int cases = 0;
  for (const auto& c : g["cases"]) {
    const GoldenCase gc = golden_case(c);
    if (!gc.sp.penalised()) continue;
    const auto want = c["kept"].get<std::vector<int32_t>>();
    const auto want_p = c["probs"].get<std::vector<double>>();
    const auto logits = golden_logits(gc.row, vocab);
    for (const char* env : {"", "device"}) {
      SCOPED_TRACE(gc.name() + " DFLASH_LOGIT_ROWS=" + env);
      setenv("DFLASH_LOGIT_ROWS", env, 1);
      LogitRows lr(*cpu, gc.sp, vocab);
      unsetenv("DFLASH_LOGIT_ROWS");
      Tensor t = cpu->upload(logits.data(), 1, vocab);
      lr.read(t, TokenHistory{&gc.history});
      const TokenDistribution got = lr.law(0).support();
      ASSERT_EQ(got.ids, want);
      for (size_t j = 0; j < want.size(); ++j)
        EXPECT_NEAR(got.probs[j], want_p[j], 1e-6 + 2e-5 * want_p[j]) << "token " << want[j];
    }
    ++cases;
  }
  EXPECT_GE(cases, 6) << "the golden has too few repetition-penalty and logit-bias cases";
}

}  // namespace
