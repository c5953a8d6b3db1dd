#!/usr/bin/env python3
"""Writes a byte-level tokenizer for the tiny random test models (vocab 256).

Ids 0..253 are the bytes themselves (no merges), so any valid UTF-8 text encodes and a
random model emits arbitrary byte sequences: exactly what exercises the server's
incremental UTF-8 decoding. Bytes 0xFE and 0xFF never occur in UTF-8, so their ids are
free: 254 is the special end-of-text token, and 255 stays outside the tokenizer because
the tiny drafters use it as their mask token (which must not be a real token).

    python3 tests/server/make_byte_tokenizer.py testdata/server/byte-tokenizer
"""
import json
import sys
from pathlib import Path

EOS = "<|endoftext|>"
# Plain-text roles: the 256-token vocab has no room for role tokens.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def byte_to_unicode():
    """GPT-2's printable stand-ins for the 256 byte values (what ByteLevel expects)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "testdata/server/byte-tokenizer")
    out.mkdir(parents=True, exist_ok=True)
    b2u = byte_to_unicode()
    vocab = {b2u[b]: b for b in range(254)}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": 254, "content": EOS, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    config = {
        "add_bos_token": False,
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": None,
        "model_max_length": 512,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
