#!/usr/bin/env python3
"""Relay's bf16 GPT training against nanoGPT under PyTorch's CPU autocast bf16, from Relay's step-0 weights.

The two mixed-precision schemes round in different places (Relay: bf16 activations and working weights
between every op, LayerNorm statistics, softmax and loss in fp32; autocast: bf16 GEMM inputs and outputs,
LayerNorm and the loss in fp32), so they cannot agree to fp32 precision. The criterion is calibrated: bf16
moves torch's own figures away from its fp32 run by d = |autocast - fp32|; Relay bf16 must stay within
MARGIN x d of torch's autocast run (and within the same of torch fp32), per kind of figure: every step's
loss and grad norm, the final parameters and AdamW moments (tensors element by element relative to
|reference| + RMS, as in test_gpt_reference.py). A Relay bug of fp32 size (a wrong op, a missing rounding
in the optimizer's working copy, a stale working copy after the update) moves the figures by far more.
Same data, schedule and model as test_gpt_reference.py's serial tied case.

Usage: test_gpt_bf16_reference.py <relay binary>   (exit 77 = skipped: no torch or h5py)
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_gpt_reference as gr  # noqa: E402  (exits 77 itself without torch or h5py)

ref, torch, np = gr.ref, gr.torch, gr.np
MARGIN = 3.0
FLOOR = 1e-3  # bf16 keeps 8 significant bits: nothing is compared tighter than ~a quarter of its ulp


def main(relay):
    opts, layout = dict(tie_embeddings=True, bias=True), dict(dp=1, pp=1, m=1)
    with tempfile.TemporaryDirectory() as d:
        cfg = ref.GPTConfig(**gr.MODEL, **opts)
        data = f"{d}/tokens.h5"
        tokens = gr.write_tokens(data, np.uint16)
        config = gr.relay_config(d, data, opts, layout).replace("[train]\n", '[train]\nprecision = "bf16"\n')
        open(f"{d}/c.toml", "w").write(config)
        try:
            gr.run_relay(relay, ["train", "--config", f"{d}/c.toml"], 1, "relay train (bf16)")
        except AssertionError as e:
            if "lacks bf16 support" in str(e):  # machines of one kind differ: oneDNN's bf16 GEMMs need AVX512
                print("SKIPPED: this CPU has no oneDNN bf16 matmul (AVX512 or newer): " + str(e).splitlines()[-1])
                return 77
            raise
        ck = f"{d}/run/checkpoints"
        start = gr.read_checkpoint(f"{ck}/step_00000000.h5")
        final = gr.read_checkpoint(f"{ck}/step_{gr.RUN['steps']:08d}.h5")
        relay_res = dict(gr.read_metrics(f"{d}/run/metrics.jsonl"), **final)

        fp32 = ref.train(cfg, start["model"], tokens, gr.RUN, torch.float32)
        bf16 = ref.train(cfg, start["model"], tokens, gr.RUN, torch.float32, autocast=True)
        calib = gr.differences(bf16, fp32)  # what bf16 alone does to torch's figures
        vs_bf16 = gr.differences(relay_res, bf16)
        vs_fp32 = gr.differences(relay_res, fp32)
        tol = {k: max(MARGIN * gr.worst(calib, k)[1], FLOOR) for k in gr.KINDS}
        print(f"{'figure':<10} {'torch bf16 vs fp32':>19} {'tolerance':>10} {'relay vs bf16':>14} "
              f"{'relay vs fp32':>14}   worst relay-vs-bf16 at")
        for k in gr.KINDS:
            w = gr.worst(vs_bf16, k)
            print(f"{k:<10} {gr.worst(calib, k)[1]:19.2e} {tol[k]:10.2e} {w[1]:14.2e} "
                  f"{gr.worst(vs_fp32, k)[1]:14.2e}   {w[0]}")
        print(f"losses relay bf16   {' '.join(f'{x:.5f}' for x in relay_res['losses'])}")
        print(f"losses torch bf16   {' '.join(f'{x:.5f}' for x in bf16['losses'])}")
        print(f"losses torch fp32   {' '.join(f'{x:.5f}' for x in fp32['losses'])}")
        bad = [(lab, e, tol[k], which) for which, diffs in (("autocast", vs_bf16), ("fp32", vs_fp32))
               for k, lab, e in diffs if not e <= tol[k]]
        if bad:
            for lab, e, t, which in bad[:12]:
                print(f"  {lab} against torch {which}: {e:.3e} > {t:.2e}")
            print(f"FAILED: {len(bad)} figures of Relay's bf16 run are further from torch than bf16 moves torch")
            return 1
    print(f"PASSED: Relay bf16 tracks torch autocast bf16 and fp32 on {gr.RUN['steps']} steps (margin {MARGIN})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(os.path.abspath(sys.argv[1])))
