#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <mutex>

#include "util/error.h"

namespace dflash {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
};

namespace {
// Match data is per thread so that one Regex can be shared by concurrent encodes.
struct MatchData {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  MatchData() { pcre2_jit_stack_assign(ctx, nullptr, stack); }
  ~MatchData() {
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};
MatchData& match_data() {
  thread_local MatchData md;
  return md;
}
// PCRE2's \s also matches U+180E (it keeps the pre-Unicode-6.3 horizontal space list), while
// Oniguruma's \s is exactly the White_Space property; spell that out so both agree.
std::string translate(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out.push_back(pattern[i]);
      continue;
    }
    const char c = pattern[++i];
    if (c == 's')
      out += "\\p{White_Space}";
    else if (c == 'S')
      out += "\\P{White_Space}";
    else
      (out += '\\') += c;
  }
  return out;
}

}  // namespace

Regex::Regex(const std::string& pattern, bool literal, const std::string& where)
    : impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_NO_UTF_CHECK;
  opts |= literal ? PCRE2_LITERAL : PCRE2_UCP;
  const std::string source = literal ? pattern : translate(pattern);
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), opts,
                              &err, &off, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    throw Error(where + ": cannot compile regex at offset " + std::to_string(off) + ": " +
                reinterpret_cast<char*>(buf));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  MatchData& md = match_data();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc =
        impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start, 0, md.data, md.ctx)
                   : pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                 md.data, md.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof(buf));
      throw Error(std::string("regex match failed: ") + reinterpret_cast<char*>(buf));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.data);
    size_t s = ov[0], e = ov[1];
    if (e == s) {
      // Empty match: skip it and step one code point, as Rust's find_iter does.
      size_t next = e + 1;
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
      start = next;
      continue;
    }
    out.emplace_back(s, e);
    start = e;
  }
}

}  // namespace dflash
