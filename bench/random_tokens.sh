# Sourced by the GPT benchmarks: random_gpt2_tokens OUT.h5 N writes N uniformly random GPT-2 token ids (seed 1) as a
# Relay token file (/tokens int32, vocab_size 50257, tokenizer "gpt2"): throughput and memory do not depend on the text.
random_gpt2_tokens() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", data=np.random.default_rng(1).integers(0, 50257, int(sys.argv[2]), dtype=np.int32))
    f.attrs["vocab_size"], f.attrs["tokenizer"] = 50257, "gpt2"
PY
}
