#!/usr/bin/env python3
"""Builds the tokenizer test fixtures under testdata/tokenizers/fixtures/.

Expected outputs come from the reference implementations: the Hugging Face `tokenizers`
library for ids and decoding, and jinja2 configured the way transformers configures it for
chat templates. Everything is seeded, so re-running gives the same files.

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install -r tools/requirements-tools.txt
    /tmp/tokvenv/bin/python tools/make_tokenizer_fixtures.py

Outputs (plain text; C++ tests read them without extra dependencies):
  corpus.jsonl               one JSON string per line
  <family>.ids               ids of each corpus line (3 base-64 digits per id, see ids_line): parse special tokens, add_special_tokens=True
  <family>.nospecial.ids     "<line index>\t<ids>" for every 5th line: special tokens as plain text,
                             add_special_tokens=False
  <family>.decode.jsonl      {"ids", "text", "text_skip"}: decode of random id sequences
  <family>.chat.jsonl        {"messages", "add_generation_prompt", "enable_thinking", "prompt"}
"""
import json
import os
import tarfile
import tempfile
import random
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTDIR = os.path.join(ROOT, "testdata", "tokenizers", "fixtures")
# The reference tokenizer files are kept compressed in the repository; read them from there.
TOKDIR = tempfile.mkdtemp(prefix="dflash-tokenizers-")
with tarfile.open(os.path.join(ROOT, "testdata", "tokenizers", "families.tar.gz")) as _archive:
    _archive.extractall(TOKDIR)
FAMILIES = ["qwen3", "llama3.1"]
CORPUS_SIZE = 20000

PROSE = [
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see what they've done!",
    "I'd say you're right, but THEY'RE NOT. Don't won't can't shan't Y'ALL'D've.",
    "Le cœur a ses raisons que la raison ne connaît point. Où est l'hôtel ? À bientôt.",
    "Größere Übungen für Äpfel und Öl, straße — Fußgängerübergänge.",
    "¿Dónde está la biblioteca? ¡Qué día tan bonito! El niño comió piñas.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Привет, мир!",
    "我能吞下玻璃而不伤身体。今天天气很好，我们去公园散步吧！人工智能正在改变世界。",
    "私はガラスを食べられます。それは私を傷つけません。東京タワーは３３３メートルです。",
    "나는 유리를 먹을 수 있어요. 그래도 아프지 않아요. 안녕하세요, 세계!",
    "أنا قادر على أكل الزجاج و هذا لا يؤلمني. مرحبا بالعالم! ١٢٣٤٥٦٧٨٩٠",
    "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती. नमस्ते दुनिया! १२३",
    "Μπορώ να φάω σπασμένα γυαλιά χωρίς να πάθω τίποτα. Γειά σου Κόσμε!",
    "אני יכול לאכול זכוכית וזה לא מזיק לי. שלום עולם!",
    "ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ สวัสดีชาวโลก",
    "Tôi có thể ăn thủy tinh mà không hại gì. Xin chào thế giới! Tiếng Việt có dấu.",
    "Cam yiyebilirim, bana zararı dokunmaz. İstanbul'da ıslak ığdır.",
    "Mogę jeść szkło i mi nie szkodzi. Zażółć gęślą jaźń.",
    "Ես կարող եմ ապակի ուտել և ինձ անհանգիստ չի զգում։ ქართული ენა ძალიან ლამაზია.",
    "আমি কাঁচ খেতে পারি, তাতে আমার কোনো ক্ষতি হয় না। தமிழ் மொழி அழகானது. తెలుగు భాష.",
    "ᚠᛇᚻ᛫ᛒᛦᚦ᛫ᚠᚱᚩᚠᚢᚱ᛫ᚠᛁᚱᚪ᛫ᚷᛖᚻᚹᛦᛚᚳᚢᛗ ⠊⠀⠉⠁⠝⠀⠑⠁⠞⠀⠛⠇⠁⠎⠎",
    "Math: ∀x∈ℝ, x²≥0; ∑ᵢ₌₁ⁿ i = n(n+1)/2 ≈ ∞ ≠ ∅. ½ ¾ ⅞ Ⅻ ⁴² ①②③",
    "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ　ａｎｄ　ＡＢＣ１２３！ ﬁ ﬂ ﬀ Ǆ ǅ ǆ ß ẞ İ ı",
]

CODE = [
    "def {f}({a}, {b}=None):\n    \"\"\"Return the {f}.\"\"\"\n    if {b} is None:\n        return {a} * {n}\n    return [{a}[i] + {b} for i in range(len({a}))]\n",
    "#include <vector>\n\nint {f}(const std::vector<int>& {a}) {{\n\tint {b} = 0;\n\tfor (int x : {a}) {b} += x * {n};\n\treturn {b};\n}}\n",
    "function {f}({a}, {b}) {{\n  const result = {a}.map((x) => x + {b} ?? {n});\n  return `${{result.length}} items`;\n}}\n",
    "fn {f}({a}: &[u32], {b}: usize) -> Option<u32> {{\n    {a}.iter().skip({b}).copied().max().map(|v| v + {n})\n}}\n",
    "func {f}({a} []int, {b} int) (int, error) {{\n\tif len({a}) == 0 {{\n\t\treturn 0, fmt.Errorf(\"empty: %d\", {b})\n\t}}\n\treturn {a}[0] + {n}, nil\n}}\n",
    "SELECT {a}.id, COUNT(*) AS {b}\nFROM {f} {a}\nWHERE {a}.score >= {n}\nGROUP BY {a}.id\nORDER BY {b} DESC;\n",
    "<div class=\"{f}\" id='{a}'>\n  <p>{b} &amp; {n}&nbsp;&lt;tag&gt;</p>\n  <!-- comment -->\n</div>\n",
    "#!/bin/bash\nset -euo pipefail\nfor {a} in $(seq 1 {n}); do\n  echo \"${{{a}}}\" | grep -E '^[0-9]+$' >> /tmp/{f}.log\ndone\n",
    "{{\"{f}\": [{n}, {n}.5, -1e-7], \"{a}\": {{\"{b}\": null, \"ok\": true}}}}\n",
    "public class {F} {{\n    private final int {a} = {n};\n    @Override\n    public String toString() {{ return \"{F}(\" + {a} + \")\"; }}\n}}\n",
    "\\begin{{equation}}\n  {f}(x) = \\int_0^{{{n}}} e^{{-x^2}} \\, dx \\quad \\text{{{a}}}\n\\end{{equation}}\n",
    "local {a} = {{}}\nfor i = 1, {n} do\n  {a}[#{a} + 1] = string.format(\"%s_%d\", \"{f}\", i)\nend\n",
]

EMOJI = [
    "👋", "👋🏻", "👋🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏴‍☠️", "❤️", "❤️‍🔥", "🇺🇸", "🇯🇵🇰🇷",
    "🧑🏾‍🤝‍🧑🏻", "😀😃😄😁", "🤖", "👍🏼👍🏽", "🙏", "🎉✨", "🏃‍♀️‍➡️", "1️⃣", "#️⃣", "©️®️™️",
    "🫠", "🪿", "🫨", "🩷",
]

SPECIAL_LIKE = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<think>", "</think>", "<tool_call>",
    "</tool_call>", "<|reserved_special_token_7|>", "<|fim_prefix|>", "<|python_tag|>",
    "<|im_start", "im_end|>", "< |im_end|>", "<|IM_END|>", "<<|im_end|>>", "<|eot_id|", "<|",
    "|>", "<think >", "</think", "<|begin_of_text|><|begin_of_text|>", "<|endoftext|>>",
]

WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\t\t", "\u00a0", "\u3000",
              "\u2009", "\u200b", "\u2028", "\u0085", "\u000b", "\u000c", "\u1680", "\u202f",
              "\u205f", "\u180e", "\ufeff", "\u001c", "\u001f", "\u2002"]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M",
                "'LL", "'D", "'ſ", "'K", "'x", "’s", "''s", "'", "'re'd"]

# Code point ranges for random text: scripts, combining marks, symbols, and recent additions.
RANGES = [
    (0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x530, 0x58F),
    (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0x980, 0x9FF), (0xE00, 0xE7F),
    (0x10A0, 0x10FF), (0x1100, 0x11FF), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x2070, 0x209F),
    (0x20A0, 0x20CF), (0x2100, 0x214F), (0x2150, 0x218F), (0x2190, 0x23FF), (0x2460, 0x24FF),
    (0x2500, 0x27BF), (0x3000, 0x303F), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
    (0xE000, 0xE0FF), (0xF900, 0xFAFF), (0xFB00, 0xFB4F), (0xFE00, 0xFE0F), (0xFF00, 0xFFEF),
    (0xFFF0, 0xFFFF), (0x10000, 0x100FF), (0x1D400, 0x1D7FF), (0x1F300, 0x1FAFF),
    (0x20000, 0x2A6DF), (0x31350, 0x323AF), (0xE0000, 0xE007F), (0x10FFF0, 0x10FFFF),
]


def rand_word(rng):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(1, 10)))


def code_sample(rng):
    t = rng.choice(CODE)
    s = t.format(f=rand_word(rng), F=rand_word(rng).capitalize(), a=rand_word(rng),
                 b=rand_word(rng), n=rng.randint(0, 100000))
    if rng.random() < 0.3:
        s = s.replace("    ", "\t")
    if rng.random() < 0.2:
        s = s.replace("\n", "\r\n")
    lines = s.split("\n")
    i = rng.randint(0, len(lines) - 1)
    return "\n".join(lines[i:i + rng.randint(1, 3)])


def prose_sample(rng):
    p = rng.choice(PROSE)
    words = p.split(" ")
    i = rng.randint(0, len(words) - 1)
    return " ".join(words[i:i + rng.randint(1, 8)])


def random_unicode(rng):
    out = []
    for _ in range(rng.randint(1, 12)):
        lo, hi = rng.choice(RANGES)
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        out.append(chr(cp))
    return "".join(out)


def number_sample(rng):
    k = rng.randint(0, 5)
    if k == 0:
        return str(rng.randint(0, 10 ** rng.randint(1, 25)))
    if k == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
    if k == 2:
        return f"{rng.randint(0, 999)},{rng.randint(0, 999):03d},{rng.randint(0, 999):03d}"
    if k == 3:
        return f"{rng.randint(1, 12)}/{rng.randint(1, 28)}/{rng.randint(1900, 2100)} {rng.randint(0, 23)}:{rng.randint(0, 59):02d}"
    if k == 4:
        return f"v{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}-rc{rng.randint(1, 9)}"
    return "".join(rng.choice("0123456789٠١٢٣४५６７") for _ in range(rng.randint(1, 30)))


def whitespace_sample(rng):
    return "".join(rng.choice(WHITESPACE) * rng.randint(1, 6) for _ in range(rng.randint(1, 5)))


def lossy_bytes(rng):
    raw = bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 24)))
    return raw.decode("utf-8", errors="replace")


def emoji_sample(rng):
    return "".join(rng.choice(EMOJI) + rng.choice(["", "", " ", "\u200d"]) for _ in range(rng.randint(1, 4)))


def piece(rng):
    k = rng.random()
    if k < 0.22:
        return prose_sample(rng)
    if k < 0.40:
        return code_sample(rng)
    if k < 0.50:
        return random_unicode(rng)
    if k < 0.58:
        return number_sample(rng)
    if k < 0.66:
        return whitespace_sample(rng)
    if k < 0.72:
        return emoji_sample(rng)
    if k < 0.80:
        return rng.choice(SPECIAL_LIKE)
    if k < 0.86:
        return rng.choice(CONTRACTIONS) + rand_word(rng)
    if k < 0.92:
        return lossy_bytes(rng)
    return rand_word(rng)


def make_corpus(rng):
    corpus = []
    # Fixed edge cases first.
    corpus += ["", " ", "  ", "\n", "\r\n", "\t", "a", "A", "'s", "'S", " '", "\u00e9", "e\u0301",
               "\u0301", "\ufffd", "\u00a0", "<|im_end|>", "<|begin_of_text|>", "<think>",
               " <|im_end|> ", "\n\n\n", " " * 100, "\t" * 50, "\n" * 40, "a" * 300, "1" * 64,
               "🏳️‍🌈" * 5, "x" + " " * 17 + "y", "   \n   \n", "hello\r\n\r\nworld"]
    while len(corpus) < CORPUS_SIZE:
        joiner = rng.choice(["", " ", "\n", "", " "])
        s = joiner.join(piece(rng) for _ in range(rng.choice([1, 1, 1, 2, 2, 3])))
        if rng.random() < 0.003:
            s = s * rng.randint(2, 10)  # occasional long string
        corpus.append(s)
    return corpus


# Ids are written as three base-64 digits each (ids < 2**18), most significant first,
# which keeps the fixtures about half the size of decimal text.
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def ids_line(ids):
    assert all(0 <= i < 1 << 18 for i in ids)
    return "".join(B64[i >> 12] + B64[(i >> 6) & 63] + B64[i & 63] for i in ids)


def write_encodings(family, tok, corpus):
    tok.encode_special_tokens = False
    encs = tok.encode_batch(corpus, add_special_tokens=True)
    with open(os.path.join(OUTDIR, f"{family}.ids"), "w", encoding="utf-8") as f:
        for e in encs:
            f.write(ids_line(e.ids) + "\n")
    tok.encode_special_tokens = True
    subset = list(range(0, len(corpus), 5))
    encs = tok.encode_batch([corpus[i] for i in subset], add_special_tokens=False)
    tok.encode_special_tokens = False
    with open(os.path.join(OUTDIR, f"{family}.nospecial.ids"), "w", encoding="utf-8") as f:
        for i, e in zip(subset, encs):
            f.write(f"{i}\t{ids_line(e.ids)}\n")


def write_decodes(family, tok, rng):
    vocab = tok.get_vocab(with_added_tokens=True)
    added = sorted(int(k) for k in tok.get_added_tokens_decoder().keys())
    n = max(vocab.values()) + 1
    # Single-byte tokens make broken UTF-8 likely; high ids exercise special tokens.
    byte_ids = [tok.token_to_id(t) for t in ["Ã", "©", "ð", "Ł", "ĺ", "¤", "Ĳ", "Ģ", "ł"]
                if tok.token_to_id(t) is not None]
    with open(os.path.join(OUTDIR, f"{family}.decode.jsonl"), "w", encoding="utf-8") as f:
        for _ in range(1000):
            ids = []
            for _ in range(rng.randint(1, 12)):
                k = rng.random()
                if k < 0.5:
                    ids.append(rng.randrange(n))
                elif k < 0.8:
                    ids.append(rng.choice(byte_ids))
                elif k < 0.95:
                    ids.append(rng.choice(added))
                else:
                    ids.append(n + rng.randint(0, 1000))  # unknown ids are skipped
            rec = {"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                   "text_skip": tok.decode(ids, skip_special_tokens=True)}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


# --- chat templates, rendered the way transformers renders them ---

def make_env():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_str(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


CHAT_TEXTS = [
    "Hello!", "What is 2+2?", "  leading and trailing spaces  ", "\n\nnewlines around\n\n",
    "Explain quantum computing in one sentence.", "你好，请介绍一下你自己。", "مرحبا، كيف حالك؟",
    "Write a haiku about the sea 🌊", "Code:\n```python\nprint('hi')\n```", "Tabs\tand\ttabs",
    "Привет! Как дела?", "<|im_end|> inside content", "मुझे एक कहानी सुनाओ", "It's fine; they'll come.",
    "", " ", "Line one\r\nLine two", "{{ not a template }} {% neither %}", "Ünïcödé ✓ 👩‍💻",
]


def chat_conversations(rng, family):
    convs = []
    for k in range(48):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": rng.choice(
                ["You are a helpful assistant.", "Réponds en français.", "  Be terse.  ", "系统提示"])})
        turns = rng.randint(1, 4)
        for t in range(turns):
            msgs.append({"role": "user", "content": rng.choice(CHAT_TEXTS)})
            if t < turns - 1 or rng.random() < 0.3:
                reply = rng.choice(CHAT_TEXTS)
                r = rng.random()
                msg = {"role": "assistant", "content": reply}
                if r < 0.25:
                    msg["content"] = "<think>\nLet me think about " + rng.choice(CHAT_TEXTS) + "\n</think>\n\n" + reply
                elif r < 0.35:
                    msg["reasoning_content"] = "Reasoning: " + rng.choice(CHAT_TEXTS)
                elif r < 0.4:
                    msg["reasoning_content"] = None
                msgs.append(msg)
            if family == "qwen3" and rng.random() < 0.15:
                msgs.append({"role": "tool", "content": "{\"temperature\": 21}"})
                if rng.random() < 0.5:
                    msgs.append({"role": "tool", "content": "second result"})
        if family == "qwen3" and k % 12 == 5:
            msgs.append({"role": "system", "content": "A late system message."})
        convs.append({"messages": msgs, "add_generation_prompt": rng.random() < 0.7,
                      "enable_thinking": rng.choice([None, True, False])})
    return convs


def write_chats(family, rng):
    with open(os.path.join(TOKDIR, family, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    template = make_env().from_string(cfg["chat_template"])
    special = {k: token_str(cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token")
               if token_str(cfg.get(k)) is not None}
    with open(os.path.join(OUTDIR, f"{family}.chat.jsonl"), "w", encoding="utf-8") as f:
        for conv in chat_conversations(rng, family):
            kwargs = dict(special)
            if conv["enable_thinking"] is not None:
                kwargs["enable_thinking"] = conv["enable_thinking"]
            prompt = template.render(messages=conv["messages"],
                                     add_generation_prompt=conv["add_generation_prompt"], **kwargs)
            f.write(json.dumps(dict(conv, prompt=prompt), ensure_ascii=False) + "\n")


def main():
    os.makedirs(OUTDIR, exist_ok=True)
    rng = random.Random(20240603)
    corpus = make_corpus(rng)
    with open(os.path.join(OUTDIR, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for s in corpus:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    for family in FAMILIES:
        tok = Tokenizer.from_file(os.path.join(TOKDIR, family, "tokenizer.json"))
        write_encodings(family, tok, corpus)
        write_decodes(family, tok, random.Random(f"decode-{family}"))
        write_chats(family, random.Random(f"chat-{family}"))
    total = sum(os.path.getsize(os.path.join(OUTDIR, n)) for n in os.listdir(OUTDIR))
    print(f"wrote {len(corpus)} strings, {total / 1e6:.2f} MB of fixtures to {OUTDIR}", file=sys.stderr)


if __name__ == "__main__":
    main()
