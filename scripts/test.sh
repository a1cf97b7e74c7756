#!/usr/bin/env bash
# Installs what the tests need, builds, and runs every test (unit, multi-rank mpirun, Slurm, PyTorch
# golden references). Works on a fresh Debian 12 machine. Usage: scripts/test.sh [ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --with-slurm --with-torch --with-extras
# The PyPI venvs of the torch tests (~2 GB of wheels, ~2.5 minutes on a fresh machine) are made while the build
# compiles: downloading and unpacking wheels is network and disk, the build is CPU. Cached: a no-op next time. The
# python is the one ctest runs the torch tests with (a venv takes its maker's interpreter and site packages).
venv_log=$(mktemp /tmp/relay-venvs-XXXXXX.log)
/usr/bin/python3 tests/torch/pypi_venv.py --all >"$venv_log" 2>&1 &
venv_pid=$!
./scripts/build.sh
venv_wait=$(date +%s)
wait "$venv_pid" || echo "test.sh: a PyPI venv could not be made; the tests that need it skip, saying why:"
echo "test.sh: PyPI venvs ready ($(( $(date +%s) - venv_wait )) s after the build):"; cat "$venv_log"; rm -f "$venv_log"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# When a rank exits non-zero, Open MPI's mpirun sends the others SIGTERM and waits odls_base_sigkill_timeout (1 s)
# before SIGKILL, even when they have exited already: ~1 s on each of the suite's hundreds of runs that are meant to
# fail (bad input, faults, stops with a resumable exit code). Relay ends a run only after MPI_Finalize or through
# MPI_Abort, so nothing is cut short; 8 bad-input tests took 37 s instead of 60.
export OMPI_MCA_odls_base_sigkill_timeout=0
# Ranks on one machine talk through ob1's shared-memory and TCP transports: UCX (Open MPI's default pml where it is
# installed) spent ~0.2 s of each launch's start-up on transports a single host does not use (2-rank start 0.33 -> 0.13
# s; 12 Layouts/Equivalence runs 9.3 -> 6.6 s). A test that needs a transport names it (tests/multinode: tcp).
export OMPI_MCA_pml=ob1
cd build
mkdir -p Testing
rc=0
start=$(date +%s)
# -j2: unit tests (one process each) two at a time; a test that starts ranks, Slurm or PyTorch declares 2 processors
# (or runs alone) in tests/CMakeLists.txt, so it still has both cores of a 2-core machine to itself.
ctest -j2 --output-on-failure --timeout 1200 "$@" 2>&1 | tee Testing/ctest_output.txt || rc=$?
echo "test.sh: ctest took $(( $(date +%s) - start )) s"
python3 ../scripts/show_failed_tests.py . --slowest 10 || true
# A failing test's output again at the very end, where a truncated CI log still shows it.
(( rc == 0 )) || python3 ../scripts/show_failed_tests.py . || true
# ctest's own summary closes the log, after the tables above.
echo; sed -n '/tests passed, .* tests failed out of/,$p' Testing/ctest_output.txt
exit "$rc"
