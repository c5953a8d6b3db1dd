// The DFlash speculative loop, written to read like sections 4 and 5 of docs/dflash.md
// (the contract): prefill, then per step draft a block, verify it, commit the longest
// correct prefix and roll back the rest.
#include <algorithm>

#include "engine/acceptance.h"
#include "engine/block_controller.h"
#include "engine/generation.h"
#include "engine/logit_rows.h"
#include "engine/output_sink.h"
#include "engine/recording_rule.h"
#include "util/error.h"

namespace dflash {

GenerationResult Engine::generate_speculative(const GenerationRequest& r) {
  if (!drafter_) throw Error("speculative decoding needs a drafter (--draft DIR)");
  check_request(r);
  GenerationResult result;
  OutputSink out(r, result);
  GenerationStats& st = result.stats;
  st.prompt_tokens = static_cast<int64_t>(r.prompt.size());
  const SamplingParams& sp = r.sampling;
  const bool greedy = sp.greedy();
  // Greedy without penalties needs only ids: they stay on the device between the passes.
  const bool ids_on_device = options_.queue_ahead && sp.argmax_only();
  const int vocab = target_.config().vocab_size;
  const std::vector<int>& feature_layers = drafter_->config().target_layer_ids;
  // Room for a whole block past max_new_tokens: the last steps draft full blocks, as the
  // drafter was trained, and max_new_tokens cuts what they commit.
  const int64_t capacity =
      std::min<int64_t>(context_length_, int64_t(r.prompt.size()) + r.max_new_tokens + draft_block_);
  Backend& b = target_.backend();
  // Whether the drafter's context rows of a verified block are queued behind the verification
  // (all B rows, truncated to the committed ones once the host knows them; EngineOptions).
  const bool context_ahead = options_.context_ahead < 0 ? b.runs_ahead() : options_.context_ahead == 1;
  Rng rng(sp.seed);
  BlockController blocks(block_size_, options_.adaptive, &history_);
  for (auto& e : blocks.take_events()) st.adaptive_events.push_back(e);
  const AcceptanceRule& rule = options_.acceptance ? *options_.acceptance : exact_acceptance_rule();
  // Penalties see the committed tokens, and in a verification each row the drafts before it.
  auto history = [&](const int32_t* extra, int count) { return TokenHistory{&r.prompt, &out.tokens(), extra, count}; };
  // Rows leave the device in the least the sampler needs (logit_rows.h): a greedy verification
  // step moves B token ids instead of B·vocab floats, a sampled one candidates or single draws.
  LogitRows target_rows(b, sp, vocab), draft_rows(b, sp, vocab);
  auto choose_last = [&](const Tensor& last_logits) {
    target_rows.read(last_logits, history(nullptr, 0));
    return target_rows.choose(0, rng);
  };

  Stopwatch total;
  SequenceState target_state = target_.new_sequence(capacity);
  SequenceState drafter_state = drafter_->new_sequence(capacity + draft_block_);

  // Prefill: the prompt's last logits give the first anchor; the features of every prompt
  // row are the drafter's first context rows.
  ForwardOutput prefill = target_.forward(target_state, r.prompt, false, feature_layers);
  drafter_->add_context(drafter_state, prefill.features);
  int32_t anchor = choose_last(prefill.logits);
  st.prefill_seconds = total.seconds();
  out.commit(anchor);

  std::vector<const TokenLaw*> q;  // the drafter's laws, when sampling (draft_rows holds them)
  RecordingRule recording;  // ids_on_device: whether a verification is queued as one recording
  while (!out.done()) {
    const int64_t s = target_state.length();  // committed positions; the anchor goes at s
    if (s >= capacity) {
      out.context_exhausted();
      break;
    }
    // B: rows to verify this step. The drafter always drafts its whole block.
    const int B = static_cast<int>(std::min<int64_t>(blocks.next(), capacity - s));

    if (B < 2) {  // a plain step: no block is worth drafting
      Stopwatch step;
      ForwardOutput f = target_.forward(target_state, {anchor}, false, feature_layers);
      if (!blocks.drafting_over()) drafter_->add_context(drafter_state, f.features);
      anchor = choose_last(f.logits);
      const double seconds = step.seconds();
      st.plain_seconds += seconds;
      ++st.plain_steps;
      blocks.record(1, 1, seconds);
      out.commit(anchor);
      continue;
    }

    std::vector<int32_t> block(B);
    block[0] = anchor;
    ForwardOutput v;
    double draft_seconds = 0;
    Stopwatch step_time;
    std::vector<int32_t> choices;  // ids_on_device: the target's choice for each row of the block
    if (ids_on_device) {
      // Sections 4 and 5 with the ids left on the device: the drafter's argmax becomes the
      // target's input there, the verification is queued while the draft runs, and one read
      // brings back the block and the target's choice for each of its rows.
      Tensor ids = b.alloc(2 * B, 1, DType::I32);
      Tensor block_ids = ids.slice_rows(0, B), choice_ids = ids.slice_rows(B, B);
      Tensor anchor_id = block_ids.slice_rows(0, 1), draft_ids = block_ids.slice_rows(1, B - 1);
      const auto draft_start = b.mark();
      b.write_ids({anchor}, anchor_id);
      drafter_->draft(drafter_state, anchor, draft_block_, B, &draft_ids);
      const auto drafted = b.mark();
      auto verify = [&] {
        v = target_.forward(target_state, block_ids, true, feature_layers, &choice_ids);
      };
      // A recording runs faster but starts only once recorded (engine/recording_rule.h).
      std::unique_ptr<QueueMark> started, verified;
      if (b.records_steps() && recording.record(st.steps)) {
        b.queue_recorded("verify " + std::to_string(B), verify, &started);
        recording.launched(B);
        verified = b.mark();
        ++st.recorded_verifications;
      } else {
        verify();
      }
      std::unique_ptr<PendingIds> pending = b.read_ids(ids);
      if (context_ahead) drafter_->add_context(drafter_state, v.features);  // runs while the host waits
      const std::vector<int32_t> read = pending->get();
      std::copy(read.begin(), read.begin() + B, block.begin());
      choices.assign(read.begin() + B, read.end());
      draft_seconds = b.seconds_between(*draft_start, *drafted);
      if (verified) {
        const double waited = b.seconds_between(*drafted, *started);
        recording.measured(waited, b.seconds_between(*started, *verified));
        st.recording_wait_seconds += waited;
        st.recording_wait_max_seconds = std::max(st.recording_wait_max_seconds, waited);
      }
    } else {
      // Section 4: draft d1 … d(B−1) from the block [anchor, MASK, …] in one drafter pass.
      Tensor dl = drafter_->draft(drafter_state, anchor, draft_block_, B);
      q.resize(B);
      // The draft's rows are penalised for the committed tokens only: a draft row's penalties
      // for the drafts before it would need each draw before the next row's law. Any q is
      // exact (section 5's rule corrects it); this one only accepts a little less often.
      draft_rows.read(dl, history(nullptr, 0));
      // d_i from row i − 1, in order (a sampled d_i is a draw from q_i); one call for the
      // block where the rows stay on the device.
      draft_rows.choose_rows(block.data() + 1, B - 1, rng);
      if (!greedy)
        for (int i = 1; i < B; ++i) q[i] = &draft_rows.law(i - 1);
      draft_seconds = step_time.seconds();

      // Section 5: the target runs the block causally; row i − 1 predicts position s + i.
      v = target_.forward(target_state, block, true, feature_layers);
      if (context_ahead) drafter_->add_context(drafter_state, v.features);
      target_rows.read(v.logits, history(block.data() + 1, B - 1));
      if (!greedy) target_rows.look_up(block.data() + 1, B - 1);  // every p(d_i) in one trip
    }
    // Greedy acceptance against the target's choice of row i − 1, however it was computed.
    auto target_choice = [&](int row_index) {
      if (ids_on_device) return choices[size_t(row_index)];
      return target_rows.choose(row_index, rng);
    };
    int accepted = 0;  // a: the longest accepted prefix of d1 … d(B−1)
    int32_t next_anchor = -1;
    for (int i = 1; i < B; ++i) {
      if (greedy) {
        const int32_t want = target_choice(i - 1);
        if (block[i] != want) {
          next_anchor = want;
          break;
        }
      } else {
        const TokenLaw& p = target_rows.law(i - 1);
        if (!rule.accept(p, *q[i], block[i], rng)) {
          next_anchor = rule.replacement(p, *q[i], rng);
          break;
        }
      }
      ++accepted;
    }
    if (options_.forced_acceptance > 0) {  // benchmark mode: see EngineOptions
      accepted = std::min(options_.forced_acceptance - 1, B - 1);
      next_anchor = ids_on_device ? choices[size_t(accepted)] : target_rows.argmax(accepted);
    } else if (accepted == B - 1) {  // every draft accepted: the last row gives the anchor
      next_anchor = target_choice(B - 1);
    }

    // Commit anchor + a drafts; rows of rejected drafts leave the target's cache, and only
    // the committed rows' features become the drafter's next context rows.
    target_state.truncate(s + accepted + 1);
    if (context_ahead) drafter_state.truncate(s + accepted + 1);
    else drafter_->add_context(drafter_state, v.features.slice_rows(0, accepted + 1));
    const double verify_seconds = step_time.seconds() - draft_seconds;
    st.draft_seconds += draft_seconds;
    st.verify_seconds += verify_seconds;
    st.record_step(B, accepted + 1);
    blocks.record(B, accepted + 1, draft_seconds + verify_seconds, draft_seconds);
    for (auto& e : blocks.take_events()) st.adaptive_events.push_back(e);

    if (!out.commit(block.data() + 1, accepted)) break;
    out.commit(next_anchor);
    anchor = next_anchor;
  }
  st.final_block_size = blocks.drafting_over() ? 1 : blocks.block();
  st.max_block_size = std::max(st.max_block_size, block_size_);
  st.draft_block_size = draft_block_;
  st.finish_request(static_cast<int64_t>(result.tokens.size()), total.seconds());
  return result;
}

}  // namespace dflash
