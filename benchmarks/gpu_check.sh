#!/usr/bin/env bash
# The GPU checks of issue 26, as one script for one short device session.
#
#   OUT=DIR bash benchmarks/gpu_check.sh [SECONDS] [STEP ...]
#
# Run from the repository root on a machine with one CUDA GPU and JAX; the
# packages the image lacks may lie as wheels in .whl/ (fiddle, libcst,
# graphviz, tensorboardX), installed first into /tmp/site. The steps (the
# default set unless STEPs are named; flan_t5_unrolled, flan_t5_xla_attn,
# flan_t5_key_masks, flan_t5_dot_merger, lm_1b_dot_merger, fp8_1b, profile_beam,
# decode_layout and mfu_suite run only when
# named), in this order, each with its own time limit, skipped when the SECONDS
# budget (default 570) no longer holds it:
#   tune_1b       --mode=tune on the 1B LM shape of C4Spmd1BAdam4Replicas on
#                 one GPU (the mfu_suite's c4_1b_1gpu: batch 8 x 1024, bf16,
#                 no logit cap); the table goes to $OUT/tune_1b.json (~220 s measured
#                 when each layout was timed once; four turns each add ~30 s)
#   train_1b      40 steps of the same in the tuned job_log_dir: the layout it
#                 takes and the MFU it logs (~60 s)
#   gpu_tests     the `gpu` tests: fused attention, the memory preflight, named
#                 ops in profiles (~105 s)
#   peer_llama    the Llama 3.2 1B step (unrolled, SAVE_EVERYTHING, 4 x 2048)
#                 against its transformers peer, torch.compile'd, in one process
#                 (benchmarks.torch_peer)
#   peer_1b       the same for the 1B LM in the layout tune chose, against GPT-2
#                 of its shape
#   flan_t5_base  the FlanT5Base step (32 x 512 -> 128, scanned, SAVE_NOTHING)
#   flan_t5_unrolled  the same step unrolled with SAVE_EVERYTHING, the layout
#                 that won for both 1B models (an unrolled T5 compiled in 43 s
#                 on the H100); measured on an H200: 0.072 s against the scanned
#                 0.0625 s, so only when named
#   flan_t5_xla_attn  the scanned step with USE_CUDNN_FLASH_ATTENTION=False: XLA's
#                 attention keeps the relative-position bias at batch 1, where
#                 cuDNN's takes it (and its gradient) at [32, 12, 512, 512] per
#                 encoder layer, with the padding mask folded in; measured on an
#                 H200: 0.087 s against 0.0625 s, so only when named
#   flan_t5_key_masks  the scanned step under each way the padding can reach
#                 cuDNN (benchmarks.key_masks, alternating in one process):
#                 as an additive [b, n, t, s] bias, as key counts (the default)
#                 and as one more head dim (the fold; measured on an H200
#                 before: 1.048x the bias step)
#   flan_t5_dot_merger  the scanned step compiled with the GPU preset (XLA's dot
#                 merger off, --xla_gpu_dot_merger_threshold_mb=0) and with the
#                 merger back at XLA's default 32 MB, alternating in one process
#                 (benchmarks.compiler_options): the merger runs q, k and v as one
#                 GEMM, then copies it apart (and concatenates the gradients);
#                 measured on an H200: off took 0.977x the time (1B LM: 0.980x)
#   lm_1b_dot_merger  the same for the tuned 1B LM
#   fp8_1b        only when named: the tuned 1B LM's step in bf16 and with USE_FP8=True
#                 (FP8 projections, delayed scaling), alternating in one process
#                 (benchmarks.settings_pair), with the float8 instructions each compiled
#   profile_t5    3 profiled FlanT5Base steps (--profile_steps, CUDA graphs off so
#                 the ops have names): where its non-GEMM time goes, to
#                 $OUT/profile_t5.json, with the trace and the step's HLO
#   beam_base     4-beam against greedy decode of a FlanT5Base-sized T5
#                 (32 x 512 -> 128; over 80 s on an H200)
#   profile_beam  only when named: one traced greedy and one traced 4-beam decode
#                 of beam_base's shape, CUDA graphs off; the per-op summaries of
#                 each go to $OUT/profile_greedy.json and $OUT/profile_beam.json
#   decode_layout only when named: FlanT5Base-sized T5 decoding (beam_base's
#                 shape, 4 beams) as a scanned model and as its unrolled twin,
#                 the layout decode runs since the KV cache moved to
#                 [batch, heads, length, dim] (benchmarks.decode_layout)
#   mfu_suite     only when named: python -m benchmarks.mfu_suite
#                 --device_kind=h100 (the 1B LM, FlanT5Base, FlanT5Large, each
#                 against its plain-JAX reference); report.md to $OUT
# Everything is printed and written to $OUT/log.
set -u
BUDGET=${1:-570}
shift $(($# > 0 ? 1 : 0))
WANTED=" ${*:-tune_1b train_1b gpu_tests peer_llama peer_1b flan_t5_base profile_t5 beam_base} "
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
PY=${PY:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi -L
$PY -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"

wanted() { [[ $WANTED == *" $1 "* ]]; }

# step NAME LIMIT CMD...: runs CMD under LIMIT seconds if the budget still holds it.
step() {
  local name=$1 limit=$2
  shift 2
  wanted "$name" || return
  local left=$((BUDGET - SECONDS))
  if ((left < limit / 2)); then
    echo "=== $name skipped: ${left}s of the budget left"
    return
  fi
  ((limit > left)) && limit=$left
  echo "=== $name (limit ${limit}s) at ${SECONDS}s"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@"
  echo "=== $name rc=$? in $((SECONDS - t0))s"
}

ONE_GPU_1B=("--set=ICI_MESH_SHAPE=[1,1,1]" --set=PERCORE_BATCH_SIZE=8 --set=COMBINE_QKV=False
            --set=ATTEN_LOGIT_CAP=-1)
step tune_1b 300 $PY -m paxlike.main --exp=C4Spmd1BAdam4Replicas --mode=tune \
  --job_log_dir=/tmp/tune_1b "${ONE_GPU_1B[@]}"
wanted tune_1b && cp /tmp/tune_1b/tune/tune.json "$OUT/tune_1b.json" 2>/dev/null
if [[ -f /tmp/tune_1b/tune/tune.json ]]; then
  step train_1b 110 $PY -m paxlike.main --exp=C4Spmd1BAdam4Replicas --mode=train \
    --job_log_dir=/tmp/tune_1b "${ONE_GPU_1B[@]}" --set=NUM_TRAIN_STEPS=40 \
    --enable_checkpoint_saving=false
  wanted train_1b && cp /tmp/tune_1b/run_env.json "$OUT/train_1b_run_env.json" 2>/dev/null
fi

step gpu_tests 170 $PY -m pytest -q -p no:cacheprovider -m gpu tests/gpu_attention_test.py \
  tests/gpu_memory_test.py tests/gpu_profile_test.py

LLAMA=("--set=ICI_MESH_SHAPE=[1,1,1]" --set=PERCORE_BATCH_SIZE=4 --set=USE_REPEATED_LAYER=False
       --set=CHECKPOINT_POLICY=SAVE_EVERYTHING)
step peer_llama 180 $PY -m benchmarks.torch_peer --exp=Llama32_1B "${LLAMA[@]}" --steps=10

step peer_1b 180 $PY -m benchmarks.torch_peer --exp=C4Spmd1BAdam4Replicas "${ONE_GPU_1B[@]}" \
  --set=USE_REPEATED_LAYER=False --set=CHECKPOINT_POLICY=SAVE_EVERYTHING --steps=10

T5_BASE=("ICI_MESH_SHAPE=[1,1,1]" PERCORE_BATCH_SIZE=32 DROPOUT_PROB=0.0)
step flan_t5_base 90 $PY -m benchmarks.train_step --exp=FlanT5Base --no-reference --steps=10 \
  --set "${T5_BASE[@]}"
step flan_t5_unrolled 120 $PY -m benchmarks.train_step --exp=FlanT5Base --no-reference \
  --steps=10 --set "${T5_BASE[@]}" USE_REPEATED_LAYER=False CHECKPOINT_POLICY=SAVE_EVERYTHING
step flan_t5_xla_attn 90 $PY -m benchmarks.train_step --exp=FlanT5Base --no-reference --steps=10 \
  --set "${T5_BASE[@]}" USE_CUDNN_FLASH_ATTENTION=False

step flan_t5_key_masks 200 $PY -m benchmarks.key_masks --exp=FlanT5Base --steps=10 \
  --ways=bias,counts,fold --set "${T5_BASE[@]}"
step flan_t5_dot_merger 90 $PY -m benchmarks.compiler_options --exp=FlanT5Base --steps=10 \
  --set "${T5_BASE[@]}" --option xla_gpu_dot_merger_threshold_mb=32
step lm_1b_dot_merger 150 $PY -m benchmarks.compiler_options --exp=C4Spmd1BAdam4Replicas \
  --steps=10 "${ONE_GPU_1B[@]}" --set=USE_REPEATED_LAYER=False \
  --set=CHECKPOINT_POLICY=SAVE_EVERYTHING --option xla_gpu_dot_merger_threshold_mb=32
step fp8_1b 200 $PY -m benchmarks.settings_pair --exp=C4Spmd1BAdam4Replicas --steps=10 \
  --set "${ONE_GPU_1B[@]/#--set=/}" USE_REPEATED_LAYER=False CHECKPOINT_POLICY=SAVE_EVERYTHING \
  --other USE_FP8=True
step profile_t5 120 $PY -m paxlike.main --exp=FlanT5Base --mode=train --job_log_dir=/tmp/prof_t5 \
  "${T5_BASE[@]/#/--set=}" --set=NUM_TRAIN_STEPS=8 --profile_steps=3 --enable_checkpoint_saving=false
if wanted profile_t5 && [[ -f /tmp/prof_t5/profile/summary.json ]]; then
  cp /tmp/prof_t5/profile/summary.json "$OUT/profile_t5.json"
  gzip -c /tmp/prof_t5/profile/step.hlo.txt > "$OUT/profile_t5.hlo.txt.gz"
  for f in /tmp/prof_t5/profile/plugins/profile/*/*.trace.json.gz; do
    cp "$f" "$OUT/profile_t5.trace.json.gz"
  done
fi

step beam_base 150 $PY -m benchmarks.beam_cost --size=base --batch=32 --input_len=512 \
  --steps=128 --dtype=bfloat16 --repeats=3
step profile_beam 150 env XLA_FLAGS=--xla_gpu_enable_command_buffer= $PY -m benchmarks.beam_cost \
  --size=base --batch=32 --input_len=512 --steps=128 --dtype=bfloat16 --repeats=1 \
  --profile_dir=/tmp/beam_prof
if wanted profile_beam; then
  cp /tmp/beam_prof/greedy.json "$OUT/profile_greedy.json" 2>/dev/null
  cp /tmp/beam_prof/beam.json "$OUT/profile_beam.json" 2>/dev/null
fi
step decode_layout 150 $PY -m benchmarks.decode_layout --family=t5 --size=base --batch=32 \
  --prompt=512 --steps=128 --dtype=bfloat16 --beams=4 --repeats=3
step mfu_suite 400 $PY -m benchmarks.mfu_suite --device_kind=h100 --steps=8 --out=/tmp/mfu
wanted mfu_suite && cp /tmp/mfu/report.md "$OUT/mfu_report.md" 2>/dev/null
echo "=== done at ${SECONDS}s"
