#!/usr/bin/env bash
# One device call on two H200s (nvidia-h200-x2), one rank per GPU over NCCL: the GPU tests,
# the per-call costs against torch.distributed and raw NCCL, and the AllReduce sweeps on each
# link class NCCL can use between the two GPUs (NVLink; NCCL_P2P_DISABLE=1, PCIe-class through
# host shared memory; with NCCL_SHM_DISABLE=1 too, sockets). Everything it writes lands in
# $OUT/results.tgz (the device tool returns few files), the logs' tails on stdout.
#   bash bench/scripts/h200x2_check.sh "info gputests percall links"
set -u
export PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RES=${RES:-/tmp/results}; mkdir -p "$RES"
# CuPy's compiled kernels: carried between calls in .cupycache (a folder git ignores)
export CUPY_CACHE_DIR=$PWD/.cupycache; mkdir -p "$CUPY_CACHE_DIR"
parts=${1:-"info gputests percall links"}
step() { echo; echo "=== $* ($(date +%T))"; }
bench() {  # bench NAME LINKENV ARGS...: one coccl-bench sweep on 2 GPUs over NCCL
  local name=$1 linkenv=$2; shift 2
  step "sweep $name ($linkenv)"
  env $linkenv timeout ${SWEEP_TIMEOUT:-240} python3 -m coccl.bench.cli allreduce --np 2 \
    --device gpu --backend nccl --no-progress --json "$RES/links-$name.json" "$@" 2>&1 \
    | grep -v "^#  Rank" | tee "$RES/links-$name.txt" | tail -${SWEEP_TAIL:-40}
}
LINK_NVLINK="COCCL_LINK=auto"
LINK_SHM="NCCL_P2P_DISABLE=1"
LINK_SOCKET="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"
for part in $parts; do case $part in
info)
  step info
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvidia-smi topo -m | head -4
  python3 -c "import cupy, torch, mpi4py; from cupy.cuda import nccl; print('cupy', cupy.__version__, 'torch', torch.__version__, 'nccl', nccl.get_version(), 'mpi4py', mpi4py.__version__)"
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -2
  python3 -c "import coccl; print('coccl ok', coccl.__file__)" ;;
gputests)
  step "pytest: GPU codecs, one-rank NCCL, torch adapter"
  timeout ${UNIT_TIMEOUT:-330} python3 -m pytest -q -x -p no:cacheprovider ${UNIT_FILES:-tests/test_codec_gpu.py \
    tests/test_codec_contract.py tests/test_nccl.py tests/test_torch_adapter.py} 2>&1 \
    | tee "$RES/pytest_gpu.txt" | tail -8
  step "pytest: one GPU per rank over NCCL (1 and 2 ranks), ranks sharing a GPU over MPI (2 and 4)"
  timeout ${MPI_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider tests/test_mpi.py \
    -k "${MPI_K:-gpu and not 3]}" 2>&1 | tee "$RES/pytest_mpi_gpu.txt" | tail -30 ;;
codecgpu)  # the GPU codec tests in two processes (kernel builds are CPU-bound)
  step "pytest: GPU codecs, whole range and the rest side by side"
  timeout ${UNIT_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider tests/test_codec_gpu.py \
    -k whole_range --durations=5 > "$RES/pytest_codec_range.txt" 2>&1 &
  timeout ${UNIT_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider tests/test_codec_gpu.py \
    -k "not whole_range" --durations=5 > "$RES/pytest_codec_rest.txt" 2>&1 &
  [ -n "${MPI_K:-}" ] && timeout ${MPI_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider \
    tests/test_mpi.py -k "$MPI_K" 2>&1 | tee "$RES/pytest_mpi_gpu.txt" | tail -15
  wait; tail -n 12 "$RES/pytest_codec_range.txt" "$RES/pytest_codec_rest.txt" ;;
probe)  # where a large AllReduce's time goes, under each setting of PROBE_ENVS (';'-separated)
  IFS=';' read -ra envs <<< "${PROBE_ENVS:-COCCL_LINK=auto}"
  for e in "${envs[@]}"; do
    step "p2p probe: $e"
    env $e timeout ${PROBE_TIMEOUT:-120} mpiexec --oversubscribe -n 2 python3 \
      bench/scripts/p2p_probe.py --out "$RES/probe-$(echo "$e" | tr -c 'A-Za-z0-9=\n' _).json" \
      ${PROBE_ARGS:-} ${PROBE_TRACE:+--trace "$PROBE_TRACE"} 2>&1 | tee -a "$RES/probe.txt" | tail -40
  done ;;
percall)
  for link in ${PERCALL_LINKS:-NVLINK SHM}; do
    step "per-call costs, $link"
    eval "env \$LINK_$link timeout 150 mpiexec --oversubscribe -n 2 python3 bench/scripts/percall.py \
      --out $RES/percall-$link.json" 2>&1 | tee "$RES/percall-$link.txt" | tail -30
  done ;;
links)
  for dt in ${LINK_DTYPES:-bfloat16 float32}; do
    bench "nvlink-$dt" "$LINK_NVLINK" -b ${MIN:-16} -e ${MAX:-1G} -f 4 -n ${ITERS:-10} -w 3 -d $dt \
      --algorithm ${ALGOS:-native,ring,two_shot,auto} --compressor identity,taco
    bench "shm-$dt" "$LINK_SHM" -b ${MIN:-16} -e ${MAX:-1G} -f 4 -n ${ITERS:-10} -w 3 -d $dt \
      --algorithm ${ALGOS:-native,ring,two_shot,auto} --compressor identity,taco
  done
  [ -n "${NO_SOCKET:-}" ] && continue
  bench "socket-bfloat16" "$LINK_SOCKET" -b 16 -e 256M -f 4 -n 5 -w 2 -d bfloat16 \
    --algorithm native,ring,two_shot,auto --compressor identity,taco ;;
sweep)  # one sweep: SWEEP_NAME, SWEEP_LINK (NVLINK, SHM, SOCKET), SWEEP_ARGS
  eval "bench $SWEEP_NAME \"\$LINK_$SWEEP_LINK\" $SWEEP_ARGS" ;;
gather)  # two-shot's AllGather phase: point-to-point against ncclAllGather, per link
  for link in ${GATHER_LINKS:-NVLINK SHM}; do for g in p2p allgather; do
    eval "bench gather-${link,,}-$g \"\$LINK_$link COCCL_NCCL_GATHER=$g\" \
      ${GATHER_ARGS:--b 256K -e 64M -f 4} -n 10 -w 3 -d bfloat16 --algorithm two_shot --compressor taco"
  done; done ;;
dtensor)
  step "TP step of examples/tp_dtensor.py: plain NCCL groups against coccl's, NVLink"
  timeout 150 torchrun --standalone --nproc-per-node 2 examples/tp_dtensor.py --device cuda \
    --dtype bfloat16 --steps ${DT_STEPS:-60} --warmup 10 --groups plain,identity@native,identity,taco \
    --out "$RES/h200x2-tp-dtensor-bf16.json" 2>&1 | tee "$RES/dtensor.txt" | tail -12
  step "the same with NCCL_P2P_DISABLE=1"
  NCCL_P2P_DISABLE=1 timeout 150 torchrun --standalone --nproc-per-node 2 examples/tp_dtensor.py \
    --device cuda --dtype bfloat16 --steps ${DT_STEPS:-60} --warmup 10 --groups plain,identity@native,taco \
    --out "$RES/h200x2-tp-dtensor-bf16-shm.json" 2>&1 | tee "$RES/dtensor-shm.txt" | tail -12 ;;
tpgpu)
  step "pytest: virtual TP ranks on the GPU"
  timeout ${TP_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider tests/test_virtual_ranks.py \
    tests/test_virtual_tp.py tests/test_tp_example.py -k "gpu or graph" 2>&1 \
    | tee "$RES/pytest_tp_gpu.txt" | tail -8 ;;
calibrate)
  step "convergence: one TP=8 taco run of ${CAL_STEPS:-200} steps, alone (step time)"
  timeout 150 python3 examples/tp_convergence_gpu.py run --arms taco --tps 8 --seeds 0 \
    --steps ${CAL_STEPS:-200} --time-limit-s 120 --work-dir /tmp/cal --out "$RES/calibrate.json" 2>&1 \
    | tee "$RES/calibrate.txt" | tail -15 ;;
convergence)
  step "convergence experiment"
  timeout ${CONV_TIMEOUT:-400} python3 examples/tp_convergence_gpu.py run ${CONV_ARGS:-} \
    --out "$RES/tp-convergence-gpu.json" 2>&1 | tee "$RES/convergence.txt" | tail -40 ;;
check)
  step "convergence: real TP=2 over NCCL against the simulator"
  timeout ${CHECK_TIMEOUT:-200} python3 examples/tp_convergence_gpu.py check ${CHECK_ARGS:-} \
    --out "$RES/tp-convergence-gpu.json" 2>&1 | tee "$RES/check.txt" | tail -20 ;;
pack)
  step pack
  mkdir -p "$RES/ranklogs"  # the multi-rank tests' per-rank logs (their failures' details)
  for f in /tmp/pytest-of-*/pytest-*/test_on_ranks*/rank-*.log; do
    [ -e "$f" ] && cp "$f" "$RES/ranklogs/$(basename "$(dirname "$f")")-$(basename "$f")"
  done
  tar czf "$OUT/results.tgz" -C "$RES" . && ls -la "$OUT"
  tar czf "$OUT/cupycache.tgz" -C "$CUPY_CACHE_DIR" . 2>/dev/null
  ls -la "$OUT" ;;
esac; done
