"""A cached virtual environment with packages from PyPI, for the tests that compare Relay with a
library Debian does not package (tiktoken, safetensors). Made once under $XDG_CACHE_HOME (or
~/.cache)/<name> and reused; when it cannot be made (no python3-venv, no network) the calling test is
skipped: exit 77 with the reason."""
import os
import subprocess
import sys


def venv_python(name, packages, system_site_packages=False):
    """The venv's python, with `packages` installed; system_site_packages: see Debian's torch and h5py."""
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), name)
    py = os.path.join(cache, "bin", "python")
    if os.path.exists(os.path.join(cache, ".ready")):
        return py
    make = [sys.executable, "-m", "venv"] + (["--system-site-packages"] if system_site_packages else []) + [cache]
    r = subprocess.run(make, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"SKIPPED: cannot make a venv ({r.stderr.strip()[-200:]}; install python3-venv)")
        sys.exit(77)
    r = subprocess.run([py, "-m", "pip", "install", "-q"] + packages, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"SKIPPED: pip could not install {' and '.join(packages)} from PyPI: {r.stderr.strip()[-300:]}")
        sys.exit(77)
    open(os.path.join(cache, ".ready"), "w").close()
    return py
