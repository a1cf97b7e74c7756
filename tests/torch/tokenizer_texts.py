"""Texts that tokenizer equivalence tests share (tests/torch/test_tiktoken_equivalence.py,
test_hf_tokenizer_equivalence.py): a generated mixed-script text, and a sweep over every code point
of Unicode planes 0-3 and 14 in contexts where a pre-tokenizer's classes (letters, numbers,
whitespace, other) decide the split, so that a difference in any class shows."""
import random


def generated_text(seed, n_chars):
    """Unicode letters, accents, CJK, emoji, digits, contractions and runs of spaces, tabs and newlines."""
    rng = random.Random(seed)
    words = ["the", "The", "naïve", "café", "Straße", "déjà", "vu", "日本語", "中文字符", "한국어", "🎉", "👍🏽", "🇫🇷",
             "Ελληνικά", "русский", "عربى", "हिन्दी", "x²", "½", "3.14159", "2024", "1,000,000", "it's", "we're",
             "they've", "I'm", "you'll", "he'd", "don't", "CAN'T", "rock'n'roll", "e-mail", "C++", "a_b", "#tag",
             "@user", "http://x.y/z?q=1", "—", "…", "«quote»", "“smart”", "\u00a0", "\u200b", "ﬁ", "Ⅻ"]
    spaces = [" ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "\n\n\n", "    ", " \t "]
    out, size = [], 0
    while size < n_chars:
        w = rng.choice(words) + rng.choice(spaces)
        out.append(w)
        size += len(w)
    return "".join(out)


def codepoint_sweep():
    """Every code point of Unicode planes 0-3 and 14 (no surrogates), each in a few contexts."""
    sweep = []
    for cp in list(range(0x20, 0xD800)) + list(range(0xE000, 0x40000)) + list(range(0xE0000, 0xE0200)):
        ch = chr(cp)
        sweep.append(f" {ch}a {ch}{ch} x{ch}\n")
    return "".join(sweep)
