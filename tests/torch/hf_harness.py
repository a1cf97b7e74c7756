"""What the transformers interop tests (test_hf_interop.py, test_moe_hf_interop.py) share: Relay runs, serial or
under mpirun, with their exit codes checked; one-error-line checks; eval losses on Relay's and transformers' side;
relative closeness; Relay's checkpoint tensors through `relay ckpt export`. Import after pypi_venv.rerun_in_venv."""
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file as load_numpy


class Harness:
    def __init__(self, relay, env, tol, block_size):
        self.relay, self.env, self.tol, self.T = relay, env, tol, block_size
        self.passed = 0

    def run(self, cmd, ranks=1, expect=0):
        cmd = ([self.relay] if ranks == 1 else
               ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), self.relay]) + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=600)
        if (r.returncode == 0) != (expect == 0) or (expect and r.returncode != expect):
            print(r.stdout[-3000:] + r.stderr[-3000:])
            sys.exit(f"FAILED: {' '.join(cmd)} exited {r.returncode}, expected {expect}")
        return r

    def ok(self, msg):
        self.passed += 1
        print(f"ok {self.passed}: {msg}")

    @staticmethod
    def eval_losses(run_dir):
        return {j["step"]: j["eval_loss"] for j in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl")))
                if "eval_loss" in j}

    def close(self, a, b, what):
        rel = abs(a - b) / max(1e-12, abs(b))
        if rel > self.tol:
            sys.exit(f"FAILED {what}: {a!r} vs {b!r} (relative {rel:.2e} > {self.tol})")
        return rel

    def hf_eval_loss(self, model, tokens):
        """transformers' mean cross-entropy over the eval file's windows, as Relay's eval reads them."""
        T = self.T
        n = (len(tokens) - 1) // T
        x = torch.tensor(np.stack([tokens[s * T:s * T + T] for s in range(n)]).astype(np.int64))
        y = torch.tensor(np.stack([tokens[s * T + 1:s * T + T + 1] for s in range(n)]).astype(np.int64))
        with torch.no_grad():
            logits = model(input_ids=x).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), y.reshape(-1)).item()

    def relay_tensors(self, run_dir, step, tmp):
        """Relay's checkpoint tensors at `step` (Relay's names and shapes), through relay ckpt export."""
        out = os.path.join(tmp, f"{os.path.basename(run_dir)}_{step}.safetensors")
        self.run(["ckpt", "export", f"{run_dir}/checkpoints/step_{step:08d}.h5", "--out", out])
        return load_numpy(out)

    def expect_error(self, cmd, needles, ranks=1):
        """Exit 1 with one error line that holds every needle."""
        r = self.run(cmd, ranks, expect=1)
        lines = sorted({ln.split("error: ", 1)[1] for ln in r.stderr.splitlines() if "error: " in ln})
        if len(lines) != 1 or not all(n in lines[0] for n in needles):
            print(r.stderr[-3000:])
            sys.exit(f"FAILED: expected one error line naming {needles}, got {lines}")
        return lines[0]
