# Sourced by the GPT benchmarks: random_gpt2_tokens OUT.h5 N writes N uniformly random GPT-2 token ids (seed 1) as a
# Relay token file (/tokens int32, vocab_size 50257, tokenizer "gpt2"): throughput and memory do not depend on the text.
# A third argument VOCAB (default 50257) draws the ids below VOCAB instead (the file's vocab_size; the model's must be
# at least that).
random_gpt2_tokens() {
  /usr/bin/python3 - "$1" "$2" "${3:-50257}" <<'PY'
import sys, h5py, numpy as np
vocab = int(sys.argv[3])
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", data=np.random.default_rng(1).integers(0, vocab, int(sys.argv[2]), dtype=np.int32))
    f.attrs["vocab_size"], f.attrs["tokenizer"] = vocab, "gpt2"
PY
}

# random_byte_tokens OUT.h5 N writes N uniformly random byte ids (0-255, seed 1) as a Relay token file (/tokens uint16,
# vocab_size 256, tokenizer "bytes"), for the configs/*-bytes.toml models.
random_byte_tokens() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["tokens"] = np.random.default_rng(1).integers(0, 256, int(sys.argv[2])).astype(np.uint16)
    f.attrs["vocab_size"], f.attrs["tokenizer"] = 256, "bytes"
PY
}
