#!/usr/bin/env python3
"""Relay's float -> FP8 and FP8 -> float conversions (src/core/fp8.hpp) against PyTorch's torch.float8_e4m3fn and
torch.float8_e5m2 casts, code for code.

Inputs, for each format: every finite FP8 value of either sign, the float32 neighbours just below and above it,
the midpoint between every two neighbouring values (a tie: round to nearest even decides) and the float32 values
just below and above that midpoint, the subnormals and the ties below the smallest one, +-0, float32 subnormals,
the max finite value, values that must saturate (just past max + half an ulp, 2 x max, 1e30, float32's max,
infinity) and NaN. Decoding: all 256 codes.

Saturation: Relay saturates (every |x| beyond max finite, infinity included, becomes +-max, as the hardware's
cvt.rn.satfinite does); a plain torch `.to(float8)` is not specified to (e5m2 overflows to inf; e4m3fn's CPU cast
saturated in torch 2.15, but NaN-on-overflow is its documented form elsewhere). So the reference is torch's cast of
the input clamped to [-max, max] first: the same rounding, saturated. NaN must stay NaN (compared as NaN, not by bits).

Relay's side is tests/torch/fp8_cast.cpp (a filter over the header); ctest passes its path in RELAY_FP8_CAST.
Usage: test_fp8_casts.py <relay binary>; exit 77 = skipped (PyTorch 2.x from PyPI not available).
"""
import os
import subprocess
import sys

RELAY = os.path.abspath(sys.argv[1])
HERE = os.path.dirname(os.path.abspath(__file__))
CAST = os.environ.get("RELAY_FP8_CAST", os.path.join(os.path.dirname(RELAY), "tests", "fp8_cast"))

if "--inside" not in sys.argv:  # Debian's torch 1.13 has no float8: re-run in the PyPI torch 2.x venv
    sys.path.insert(0, HERE)
    from pypi_venv import rerun_in_venv, torch2_python

    rerun_in_venv(torch2_python, __file__, RELAY)

import numpy as np  # noqa: E402
import torch  # noqa: E402

if not os.path.exists(CAST):
    sys.exit(f"FAILED: {CAST} not found (build the fp8_cast target, or set RELAY_FP8_CAST)")

FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


def relay_cast(mode, fmt, values=None):
    r = subprocess.run([CAST, mode, fmt], input=None if values is None else values.astype("<f4").tobytes(),
                       capture_output=True)
    if r.returncode != 0:
        sys.exit(f"FAILED: {CAST} {mode} {fmt} exited {r.returncode}: {r.stderr.decode()[-500:]}")
    return r.stdout


def neighbourhoods(finite):
    """The inputs described in the module's docstring, as float32, from the sorted positive finite values."""
    f32 = np.float32
    pos = finite[finite >= 0]
    up, down = f32(np.inf), f32(-np.inf)
    v = [pos, np.nextafter(pos, up), np.nextafter(pos, down)]
    mids = ((pos[:-1].astype(np.float64) + pos[1:]) / 2).astype(f32)  # exact: both fp8, float32 has the room
    v += [mids, np.nextafter(mids, up), np.nextafter(mids, down)]
    top = pos[-1].astype(np.float64)
    ulp = top - pos[-2]
    past = np.array([top + ulp / 2, top + ulp, 2 * top, 1e30, np.finfo(f32).max, np.inf], dtype=f32)
    with np.errstate(over="ignore"):  # float32's max and up: inf
        v += [past, np.nextafter(past, up), np.nextafter(past, down)]
    v += [np.array([0.0, np.finfo(f32).tiny, 1e-45, 1e-40, pos[1] / 2, pos[1] / 4, pos[1] * 0.75], dtype=f32)]
    x = np.concatenate(v)
    x = np.concatenate([x, -x, np.array([np.nan, -np.nan], dtype=f32)])
    return x


failures = 0
for fmt, (dtype, max_finite) in FORMATS.items():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    torch_values = codes.view(dtype).float().numpy()  # (256) the value of every code, per torch
    relay_values = np.frombuffer(relay_cast("decode", fmt), dtype="<f4")
    for b in range(256):
        t, r = torch_values[b], relay_values[b]
        same = (np.isnan(t) and np.isnan(r)) or (t == r and np.signbit(t) == np.signbit(r))
        if not same:
            failures += 1
            print(f"FAILED {fmt} decode 0x{b:02x}: relay {r!r}, torch {t!r}")
    finite = np.unique(torch_values[np.isfinite(torch_values)])
    assert finite.max() == max_finite, (fmt, finite.max())

    x = neighbourhoods(finite)
    clamped = torch.clamp(torch.from_numpy(x), -max_finite, max_finite)  # NaN stays NaN
    want = clamped.to(dtype).view(torch.uint8).numpy()
    got = np.frombuffer(relay_cast("encode", fmt, x), dtype=np.uint8)
    assert len(got) == len(x)
    want_nan, got_nan = np.isnan(codes.view(dtype).float().numpy()[want]), np.isnan(relay_values[got])
    bad = np.nonzero((want != got) & ~(want_nan & got_nan))[0]
    for i in bad[:20]:
        print(f"FAILED {fmt} encode {x[i]!r} ({x[i].view(np.uint32):#010x}): relay 0x{got[i]:02x} "
              f"({relay_values[got[i]]}), torch(clamped) 0x{want[i]:02x} ({torch_values[want[i]]})")
    failures += len(bad)
    saturated = int(np.sum(np.abs(x[~np.isnan(x)]) > max_finite))
    print(f"{fmt}: 256 codes decoded, {len(x)} values encoded ({saturated} beyond max finite {max_finite:g}, "
          f"{int(np.sum(np.isnan(x)))} NaN): {len(bad)} differ from torch {torch.__version__}")

if failures:
    sys.exit(f"FAILED: {failures} conversions differ")
print("OK")
