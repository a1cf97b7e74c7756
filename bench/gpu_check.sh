#!/usr/bin/env bash
# One lease on a GPU machine, in one command: the CUDA tests, then the benchmarks, then a per-kernel profile.
# Run from the checkout root on the GPU machine after `eval "$(bash .gpu-bundle/setup.sh)"` (../shared/gpu/README.md).
# The device tool copies the checkout to the same path as here (/work/main), so setup.sh leaves the bundled build
# under /opt/relay-root: move it into place first, as every call of this session did:
#   bench/gpu_bundle.sh here, then there: eval "$(bash .gpu-bundle/setup.sh)" && rm -rf build && mv /opt/relay-root/work/main/build-gpu build && bench/gpu_check.sh
# Logs go to OUT (default /tmp/relay-gpu-check); a short summary is printed last. GoogleTest reads GTEST_FILTER from the
# environment: e.g. GTEST_FILTER='*mla*:*group_router*:*Deepseek*' bench/gpu_check.sh tests runs only DeepSeek-V3's
# CUDA rows (test_backend_ops) and its training case (test_gpu_training_mpi).
# Usage: bench/gpu_check.sh [parts ("tests fp8 mlp lm profile"; also "adamw", "plan": the planner calibrated on this GPU, and
#   "moe-cpu": the MoE CPU benchmark on two of the host's cores, for its bf16)]
# "fp8" (issue 43's CUDA part): the FP8 rows of test_backend_ops and test_gpu_training_mpi's FP8 case alone (they also
#   run inside "tests"), then bench/bench_gpu_fp8.sh (FP8 GEMM at 8192^3 and the Llama 3 8B-shaped 4 layers vs bf16).
# "adamw": the optimizer rows of test_backend_ops alone (also inside "tests"): every AdamW / SGD row against the CPU,
#   the multi-tensor AdamW (adamw_many_*) among them, and BackendOpsAdamW.CudaManyEqualsEachTensorsStepBitwise (the
#   fused kernel against the per-tensor one, bit for bit, over a launch's every boundary).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/relay-gpu-check}
PARTS=${1:-tests fp8 mlp lm profile}
mkdir -p "$OUT/logs"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
summary=$OUT/summary.txt
: >"$summary"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee -a "$summary"
python3 -c "import torch; print('torch', torch.__version__)" 2>&1 | tee -a "$summary"

for part in $PARTS; do
  case $part in
    tests)
      for t in ${TESTS:-test_gpu_peaks test_backend_ops test_gpu_training_mpi}; do
        [[ -x build/tests/$t ]] || { echo "$t: not built" | tee -a "$summary"; continue; }
        s=$SECONDS
        timeout ${TEST_TIMEOUT:-240} build/tests/$t >"$OUT/logs/$t.log" 2>&1; rc=$?
        { echo "$t: exit $rc in $((SECONDS - s)) s: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/logs/$t.log" | tr '\n' ' ')"
          grep -E '^\[  FAILED  \]' "$OUT/logs/$t.log" | sort -u | head -40; } | tee -a "$summary"
      done ;;
    fp8)
      for t in "test_backend_ops --gtest_filter=*fp8*" "test_gpu_training_mpi --gtest_filter=*Fp8*"; do
        log=$OUT/logs/fp8-${t%% *}.log
        s=$SECONDS
        set -f; timeout ${FP8_TEST_TIMEOUT:-240} build/tests/$t >"$log" 2>&1; rc=$?; set +f  # the filter's * unglobbed
        { echo "fp8 $t: exit $rc in $((SECONDS - s)) s: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$log" | tr '\n' ' ')"
          grep -E '^\[  FAILED  \]|cuBLASLt refused|RELAY_FP8_GEMM=lt|^GPT fp8' "$log" | sort -u | head -40; } | tee -a "$summary"
      done
      timeout ${FP8_BENCH_TIMEOUT:-300} bench/bench_gpu_fp8.sh build/relay ${FP8_STEPS:-8} >"$OUT/logs/bench_fp8.log" 2>&1
      echo "bench_gpu_fp8 (exit $?):" | tee -a "$summary"
      grep -v '^# lscpu\|^# load' "$OUT/logs/bench_fp8.log" | tee -a "$summary" ;;
    adamw)
      log=$OUT/logs/adamw-test_backend_ops.log
      s=$SECONDS
      timeout ${ADAMW_TEST_TIMEOUT:-120} build/tests/test_backend_ops --gtest_filter='*adamw*:*sgd*:*AdamW*' >"$log" 2>&1
      rc=$?
      { echo "adamw test_backend_ops: exit $rc in $((SECONDS - s)) s: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$log" | tr '\n' ' ')"
        grep -E '^\[  FAILED  \]' "$log" | sort -u | head -40; } | tee -a "$summary" ;;
    mlp)
      timeout 120 bench/bench_gpu.sh build/relay 30 >"$OUT/logs/bench_mlp.log" 2>&1
      tail -n 12 "$OUT/logs/bench_mlp.log" >>"$summary" ;;
    lm)
      BENCH_WORK=/tmp/relay-gpulm timeout ${LM_TIMEOUT:-330} bench/bench_gpu_lm.sh build/relay ${LM_STEPS:-15} ${LM_MB:-16} \
        ${LM_M:-4} "${LM_MODELS:-gpt llama}" "${LM_MODES:-eager compile}" >"$OUT/logs/bench_lm.log" 2>&1
      cat "$OUT/logs/bench_lm.log" >>"$summary"
      if [[ -n ${LM_VOCAB:-} ]]; then  # e.g. 50304: GPT-2 with its vocabulary padded to a multiple of 64, both sides
        echo "# GPT-2 with vocab_size $LM_VOCAB (Relay and PyTorch eager):" | tee -a "$summary" >>"$OUT/logs/bench_lm.log"
        RELAY_SETS="model.vocab_size=$LM_VOCAB" GPT_VOCAB=$LM_VOCAB BENCH_WORK=/tmp/relay-gpulm3 timeout 150 \
          bench/bench_gpu_lm.sh build/relay ${LM_STEPS:-15} ${LM_MB:-16} ${LM_M:-4} gpt eager 2>&1 | tail -n +3 |
          grep -v '^torch ' | tee -a "$summary" >>"$OUT/logs/bench_lm.log"
      fi
      if [[ -n ${LM_EXTRA:-} ]]; then  # e.g. "32 2": Relay alone at another micro-batch x micro-batches
        BENCH_WORK=/tmp/relay-gpulm2 timeout 120 bench/bench_gpu_lm.sh build/relay ${LM_STEPS:-15} $LM_EXTRA \
          "${LM_MODELS:-gpt llama}" none 2>&1 | tail -n +2 | tee -a "$summary" >>"$OUT/logs/bench_lm.log"
      fi
      for f in /tmp/relay-gpulm/relay-*.out; do [[ -f $f ]] && tail -n 30 "$f" >"$OUT/logs/$(basename "$f").txt"; done ;;
    plan)
      # The planner against Relay on this GPU: `relay plan --measure --calibrate` measures the GPU at GPT-2 124M's and
      # the SmolLM2-shaped Llama's shapes (bf16, micro-batch 16 x 1024), then a 6-step run with --plan-cluster prints
      # the predicted-vs-measured table (one GPU: no link measured).
      [[ -f /tmp/relay-gpulm/tokens.h5 ]] || { echo "plan: no token file (run the lm part first)" >>"$summary"; continue; }
      for target in ${PLAN_TARGETS:-gpt llama}; do
        case $target in
          gpt) args=(--config configs/gpt2-124m.toml) ;;
          llama) args=(--config configs/smollm2-135m.toml --set model.block_size=1024) ;;
        esac
        args+=(--set 'data.train="/tmp/relay-gpulm/tokens.h5"' --set 'data.eval=""' --set train.batch_size=64
               --set train.micro_batches=4 --set lr_schedule.warmup_steps=0 --set 'train.device="cuda"'
               --set 'train.precision="bf16"')
        timeout ${PLAN_TIMEOUT:-150} build/relay plan "${args[@]}" --measure --calibrate "$OUT/logs/cal-$target.toml" \
          >"$OUT/logs/plan-$target.log" 2>&1 &&
        timeout ${PLAN_TIMEOUT:-150} build/relay train "${args[@]}" --plan-cluster "$OUT/logs/cal-$target.toml" \
          --set "run.dir=\"/tmp/relay-plan-$target\"" --set train.steps=${PLAN_STEPS:-6} --set 'checkpoint.resume="none"' \
          >>"$OUT/logs/plan-$target.log" 2>&1
        echo "plan $target (exit $?):" | tee -a "$summary"
        grep -A8 "plan vs measured" "$OUT/logs/plan-$target.log" | tee -a "$summary"
        grep -E "^(peak_bf16_flops|gemm_efficiency|attention_|memory_bandwidth|kernel_launch)" \
          "$OUT/logs/cal-$target.toml" | tee -a "$summary"
      done ;;
    moe-cpu)
      # Issue 25's CPU bf16 targets on this machine's host CPU (AVX512_BF16 where the development machine has none):
      # bench/bench_moe_cpu.sh on two cores, 2 threads, against this machine's own PyTorch and transformers.
      TORCH2_PYTHON=${TORCH2_PYTHON:-python3} timeout ${MOE_TIMEOUT:-240} taskset -c 0,1 bench/bench_moe_cpu.sh build/relay \
        ${MOE_STEPS:-12} 2 >"$OUT/logs/bench_moe_cpu.log" 2>&1
      echo "moe-cpu (exit $?):" | tee -a "$summary"
      tee -a "$summary" <"$OUT/logs/bench_moe_cpu.log" ;;
    profile)
      # GPU time by op (RELAY_OP_PROFILE=1: CUDA events around every backend op) over 6 steps: GPT-2 124M and
      # Llama (SmolLM2 shape, T 1024) at micro-batch 16, bf16; the bf16 MLP of bench_gpu.sh.
      [[ -f /tmp/relay-gpulm/tokens.h5 ]] || { echo "profile: no token file (run the lm part first)" >>"$summary"; continue; }
      lm=(--set 'data.train="/tmp/relay-gpulm/tokens.h5"' --set 'data.eval=""' --set train.batch_size=16
          --set train.micro_batches=1 --set lr_schedule.warmup_steps=0)
      for target in ${PROF_TARGETS:-gpt llama mlp}; do
        case $target in
          gpt) args=(--config configs/gpt2-124m.toml "${lm[@]}") ;;
          llama) args=(--config configs/smollm2-135m.toml --set model.block_size=1024 "${lm[@]}") ;;
          mlp) build/relay data synth --out /tmp/relay-mlp.h5 --samples 16384 --features 8192 --classes 10 --seed 1 >/dev/null
               args=(--config configs/bench_gpu_mlp.toml --set 'data.train="/tmp/relay-mlp.h5"') ;;
        esac
        RELAY_OP_PROFILE=${PROF_MODE:-1} timeout ${PROF_TIMEOUT:-100} build/relay train "${args[@]}" \
          --set "run.dir=\"/tmp/relay-prof-$target\"" --set 'train.device="cuda"' --set 'train.precision="bf16"' \
          --set train.steps=${PROF_STEPS:-6} --set 'checkpoint.resume="none"' >"$OUT/logs/prof-$target.log" 2>&1
        echo "profile $target (exit $?):" | tee -a "$summary"
        sed -n '/GPU time by op/,$p' "$OUT/logs/prof-$target.log" | head -${PROF_LINES:-24} | tee -a "$summary"
      done
      # PyTorch's SDPA at the profiles' attention shapes: per-call times beside Relay's flash_attention ops.
      timeout 60 python3 bench/torch_gpu_attention.py 16 1024 2>&1 | tail -n 2 | tee -a "$summary" ;;
  esac
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "=== summary ==="; cat "$summary"
