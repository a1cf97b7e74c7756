#!/usr/bin/env python3
"""PyTorch reference for Relay's GPU MLP benchmark (bench/bench_mlp --device cuda).

Trains the same model on one GPU: input 8192 -> 4 hidden layers of 8192 with GELU -> 10 classes,
batch 8192, AdamW, cross-entropy on synthetic data, in fp32 (TF32 off, as Relay's fp32 GEMMs), tf32 (fp32 with
allow_tf32, as Relay's train.precision = "tf32") and with bf16 autocast (bf16 GEMM inputs, fp32 master weights, as
Relay's train.precision = "bf16").
Prints an nccl-tests style table; the formula for every derived column is in the header.

  python3 bench/torch_gpu_mlp.py                      # the three precisions, default sizes
  python3 bench/torch_gpu_mlp.py --precision bf16 --batch 4096 --steps 50

Exit code 77 (skip) when PyTorch or a CUDA device is missing.
"""
import argparse
import math
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", type=int, default=8192, help="input features")
    p.add_argument("--width", type=int, default=8192, help="hidden width")
    p.add_argument("--depth", type=int, default=4, help="hidden layers (Linear + GELU each)")
    p.add_argument("--classes", type=int, default=10, help="output classes")
    p.add_argument("--batch", type=int, default=8192, help="samples per step")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--precision", default="fp32,tf32,bf16", help="comma list of fp32, tf32, bf16")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tf32", action="store_true", help="allow TF32 in the fp32 row's GEMMs too (Relay does not)")
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def build_model(torch, args):
    layers = []
    width_in = args.input
    for _ in range(args.depth):
        layers += [torch.nn.Linear(width_in, args.width), torch.nn.GELU()]  # exact erf GELU, as Relay
        width_in = args.width
    layers.append(torch.nn.Linear(width_in, args.classes))
    return torch.nn.Sequential(*layers)


def run(torch, args, precision):
    """Returns (seconds per step, first loss, last loss) for one precision."""
    torch.manual_seed(args.seed)
    device = torch.device("cuda")
    model = build_model(torch, args).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(args.batch, args.input, device=device)                 # (batch, input)
    y = torch.randint(0, args.classes, (args.batch,), device=device)       # (batch,)
    use_bf16 = precision == "bf16"
    torch.backends.cuda.matmul.allow_tf32 = args.tf32 or precision == "tf32"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    first = step().item()
    for _ in range(max(args.warmup - 1, 0)):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / args.steps
    last = loss.item()
    del model, opt, x, y
    torch.cuda.empty_cache()
    return seconds, first, last


def main():
    args = parse_args()
    try:
        import torch
    except ImportError:
        print("# skipped: PyTorch is not installed (pip install torch)")
        return 77
    if not torch.cuda.is_available():
        print("# skipped: no CUDA device visible to PyTorch (check CUDA_VISIBLE_DEVICES)")
        return 77
    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    for p in precisions:
        if p not in ("fp32", "tf32", "bf16"):
            print(f"error: --precision {p}: expected fp32, tf32 or bf16", file=sys.stderr)
            return 2

    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    params = sum(p.numel() for p in build_model(torch, args).parameters())
    dims = " -> ".join([str(args.input)] + [f"{args.depth} x {args.width} (GELU)", str(args.classes)])

    print(f"# PyTorch reference MLP training: torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.cuda.get_device_name(0)}")
    print(f"# model: {dims}; params {params:,}; batch {args.batch}; AdamW lr {args.lr}; "
          f"cross-entropy; tf32 {'on' if args.tf32 else 'off'} in the fp32 row")
    print(f"# steps: {args.warmup} warm-up, {args.steps} timed")
    print("# samples/s = batch / (time per step);  TFLOP/s = 6 x params x samples/s / 1e12")
    print("# ok: both losses finite (#wrong = 0)")
    print("#")
    header = (f"{'precision':>10} {'batch':>7} {'steps':>6} {'step(ms)':>10} {'samples/s':>12} "
              f"{'TFLOP/s':>9} {'loss_first':>11} {'loss_last':>10} {'#wrong':>7}")
    print("#" + header[1:])
    wrong_total = 0
    for p in precisions:
        seconds, first, last = run(torch, args, p)
        samples = args.batch / seconds
        tflops = 6.0 * params * samples / 1e12
        wrong = 0 if (math.isfinite(first) and math.isfinite(last)) else 1
        wrong_total += wrong
        print(f"{p:>10} {args.batch:>7} {args.steps:>6} {seconds * 1e3:>10.2f} {samples:>12.1f} "
              f"{tflops:>9.2f} {first:>11.4f} {last:>10.4f} {wrong:>7}")
        sys.stdout.flush()
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main())
