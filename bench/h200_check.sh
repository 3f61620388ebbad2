#!/usr/bin/env bash
# One device call on the H200: install offline, check and time the GPU codec kernels, run
# the GPU tests (one-rank NCCL, several ranks sharing the GPU over MPI), and a short
# 4-rank MPI sweep. Logs and JSON land in $OUT. Usage: bash bench/h200_check.sh [parts]
set -u
export PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
# Open MPI's shared-memory transport copies a large message in one call on the receiver
# (Linux CMA) instead of through 32 KiB fragments that both ranks' threads must move; the
# H200 machine's environment sets the fragments (none). H200_SINGLE_COPY=none reproduces
# the figures measured before session 7.
export OMPI_MCA_btl_vader_single_copy_mechanism=${H200_SINGLE_COPY:-cma}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
parts=${1:-"info codec tests mpitests sweep"}
JSONDIR=${JSONDIR:-$OUT}
step() { echo; echo "=== $* ($(date +%T))"; }
for part in $parts; do case $part in
info)
  step info
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c "import cupy, numba, mpi4py, torch; print('cupy', cupy.__version__, 'numba', numba.__version__, 'mpi4py', mpi4py.__version__, 'torch', torch.__version__)"
  mpiexec --version | head -1
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -2
  python3 -c "import coccl; print('coccl ok', coccl.__file__)" ;;
codec)
  step codec kernels
  timeout 300 python3 bench/gpu_codec_check.py --out "$OUT" 2>&1 | tee "$OUT/codec_log.txt" | tail -70 ;;
tests)
  step pytest gpu single process
  timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu.py tests/test_nccl.py 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -15 ;;
mpitests)
  step pytest gpu multi-rank
  timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_mpi.py -k "gpu and (2 or 4)" 2>&1 | tee "$OUT/pytest_mpi_gpu.txt" | tail -25 ;;
sweep)
  step 4-rank MPI sweep on the GPU
  timeout 300 python3 -m coccl.bench.cli allreduce --np 4 --device gpu -b 1M -e 256M -f 4 -n 5 -w 2 --no-progress \
    --algorithm ring,two_shot --compressor identity,taco,int8 -d float32 \
    --json "$OUT/mpi4.json" 2>&1 | tee "$OUT/sweep.txt" | tail -40 ;;
tune)
  step codec tuning and throughput
  timeout 240 python3 bench/gpu_codec_check.py --out "$OUT" --skip-checks 2>&1 | tee "$OUT/codec_log.txt" | tail -45 ;;
nccltests)
  step "pytest NCCL: one rank, then one GPU per rank"
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_nccl.py tests/test_mpi.py -k "nccl" 2>&1 | tee "$OUT/pytest_nccl.txt" | tail -8 ;;
mpitests_all)
  step pytest gpu multi-rank, 1-4 ranks
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_mpi.py -k gpu 2>&1 | tee "$OUT/pytest_mpi_gpu.txt" | tail -8 ;;
sweeps)
  for dt in ${SWEEP_DTYPES:-float32 bfloat16}; do
    step "4-rank MPI sweep on the GPU, $dt, with overlap"
    timeout ${SWEEP_TIMEOUT:-290} python3 -m coccl.bench.cli allreduce --np 4 --device gpu -b 1M -e 1G -f 4 -n ${SWEEP_ITERS:-4} -w 1 --no-progress \
      --algorithm ring,two_shot --compressor identity,taco,int8 -d $dt --overlap-min 64M \
      --overlap-iters ${SWEEP_OVERLAP_ITERS:-15} --json "$JSONDIR/mpi4-$dt.json" 2>&1 | tee "$OUT/sweep-$dt.txt" | grep -v "^#  Rank" | tail -24
  done ;;
chunks)
  for cb in 4M 16M; do
    step "4-rank two_shot taco, 256 MiB float32, chunks of $cb"
    timeout 90 python3 -m coccl.bench.cli allreduce --np 4 --device gpu -b 256M -e 256M -n 5 -w 1 --no-progress \
      --algorithm two_shot,ring --compressor taco -d float32 --overlap-min 64M --chunk-bytes $cb \
      --json "$JSONDIR/mpi4-chunks-$cb.json" 2>&1 | grep -v "^#  Rank" | tail -5
  done ;;
probe)
  step "4-rank overlap probe: ${PROBE_ARGS:-defaults}"
  timeout ${PROBE_TIMEOUT:-200} mpiexec --oversubscribe -n 4 python3 bench/overlap_probe.py \
    --out "$JSONDIR/probe-${PROBE_NAME:-1}.json" ${PROBE_ARGS:-} 2>&1 | grep -v "^#  Rank" | tail -80 ;;
latency)
  step "4-rank latency sweep on the GPU (auto's table)"
  timeout 60 python3 -m coccl.bench.cli allreduce --np 4 --device gpu -b 8 -e 4M -f 4 -n 10 -w 3 --no-progress \
    --algorithm two_shot,auto --compressor identity,taco -d bfloat16 \
    --json "$JSONDIR/mpi4-latency.json" 2>&1 | grep -v "^#  Rank" | tail -30 ;;
ncclchunks)
  # Two or more GPUs, one rank each, coccl over NCCL: the chunk size's effect (NCCL_CHUNKS;
  # "default" leaves it to coccl).
  for dt in ${NCCL_DTYPES:-bfloat16 float32}; do for cb in ${NCCL_CHUNKS:-4M 16M 32M 64M}; do
    step "NCCL AllReduce on ${NCCL_NP:-2} GPUs, $dt, chunks of $cb"
    timeout ${NCCL_TIMEOUT:-150} python3 -m coccl.bench.cli allreduce --np ${NCCL_NP:-2} --device gpu --backend nccl \
      -b ${NCCL_MIN:-4M} -e 1G -f 4 -n 5 -w 2 --no-progress --algorithm ${NCCL_ALGOS:-native,ring,two_shot} \
      --compressor identity,taco -d $dt -c ${NCCL_CHECK:-1} $([ $cb = default ] || echo --chunk-bytes $cb) \
      --json "$JSONDIR/nccl-$dt-$cb.json" 2>&1 \
      | grep -v "^#  Rank" | tail -22
  done; done ;;
tp)
  step "TP GPT smoke on the GPU: 2 ranks sharing it over MPI"
  timeout 150 mpiexec --oversubscribe -n 2 python3 -m mpi4py examples/tp_gpt.py --device cuda --backend mpi \
    --steps 60 --tp-compressor taco --tp-algorithm two_shot --log-every 20 2>&1 | tail -6 ;;
esac; done
