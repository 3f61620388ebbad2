#!/usr/bin/env bash
# GPU checks and measurements on one machine, part by part; logs and JSON land in $OUT
# (JSON in $JSONDIR if set). Usage, from the repository root:
#   bash bench/scripts/h200_check.sh [parts]     (default: "info codec tests mpitests sweep")
# Figures measured this way, with their commit, live in bench/results/*.json and
# bench/NOTES.md, not here.
set -u
export PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
# Open MPI's shared-memory transport: "cma" (Linux cross-memory attach) copies a large
# message in one call on the receiver; "none" moves it through 32 KiB fragments that both
# ranks copy inside their MPI calls. H200_SINGLE_COPY selects one for the A/B.
export OMPI_MCA_btl_vader_single_copy_mechanism=${H200_SINGLE_COPY:-cma}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
parts=${1:-"info codec tests mpitests sweep"}
JSONDIR=${JSONDIR:-$OUT}
step() { echo; echo "=== $* ($(date +%T))"; }
floor_runs() {  # the decodes' byte-mix floor, reads spread and phased; JSON $JSONDIR/$1<reads>.json
  step "decode byte-mix floor, reads spread and phased"
  for reads in spread phased; do
    timeout 80 python3 bench/scripts/stream_floor.py --reads $reads --counts 16M,64M,256M \
      --compressor taco,int:bits=4,hadamard=32,mx,mx:element=e2m3,tah:row=4096 \
      --json "$JSONDIR/$1$reads.json" 2>&1 | tee -a "$OUT/floor_log.txt" | tail -30
  done
}
# An MPS control daemon, so that ranks sharing the GPU run their kernels side by side
# instead of time-sliced between their contexts (as ranks on GPUs of their own would).
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/coccl-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/coccl-mps/log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d || { echo "MPS did not start"; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; return 1; }
}
mps_stop() { echo quit | nvidia-cuda-mps-control; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; }
# A resumable work folder of convergence runs: kept where it exists; new, unpacked from the
# tar $2 (a folder's runs, as a part leaves them in $OUT) where that exists, else written in
# from the recorded reports $4... (prepopulate_runs.py), leaving out the runs named in $3
# (comma-separated), which run again.
work_folder() {
  local W=$1 prior=$2 redo=$3; shift 3
  [ -d $W ] && return
  if [ -f "$prior" ]; then mkdir -p $W && tar xzf "$prior" -C $W; return; fi
  for report in "$@"; do python3 bench/scripts/prepopulate_runs.py $report $W --except "$redo"; done
}
# The TP frontier's runs in folder $1 (tp_convergence_gpu.py frontier with the arguments
# after $3, 10 workers, at most $TPS_TIMEOUT s, runs stopped at $TPS_LIMIT_S), its report
# $JSONDIR/$2; its log $OUT/$3_log.txt and the folder's finished runs $OUT/$3-runs.tgz.
frontier_runs() {
  local W=$1 json=$2 tag=$3; shift 3
  timeout ${TPS_TIMEOUT:-560} python3 examples/tp_convergence_gpu.py frontier "$@" \
    --jobs-per-gpu 10 --time-limit-s ${TPS_LIMIT_S:-500} --work-dir $W \
    --out "$JSONDIR/$json" 2>&1 | tee "$OUT/${tag}_log.txt" | tail -40
  tar czf "$OUT/$tag-runs.tgz" -C $W --exclude='*.ckpt' .
}
for part in $parts; do case $part in
info)
  # The machine: GPU, driver, clocks, library versions; installs coccl from this checkout.
  step info
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c "import cupy, numba, mpi4py, torch; print('cupy', cupy.__version__, 'numba', numba.__version__, 'mpi4py', mpi4py.__version__, 'torch', torch.__version__)"
  mpiexec --version | head -1
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -2
  python3 -c "import coccl; print('coccl ok', coccl.__file__)" ;;
codec)
  # Codec kernels: throughput against the device copy, each roundtrip within its bound and
  # byte-identical to the host's kernels, the encode's launch configurations, the host's
  # launch cost, and the hardware FP8 conversion against the software one (all 2^32 inputs).
  step codec kernels
  timeout 300 python3 -m coccl.bench.cli codec --device gpu --counts 64M,256M \
    --compressor identity,int8,taco,taco:group_size=32,taco:group_size=512 -d bfloat16,float16,float32 \
    -n 25 --tuning --launch-cost --fp8-check --json "$JSONDIR/codec.json" 2>&1 | tee "$OUT/codec_log.txt" | tail -70 ;;
tests)
  # The GPU tests that need one process: codec kernels against the CPU's, one-rank NCCL.
  step pytest gpu single process
  timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu.py tests/test_nccl.py 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -15 ;;
mpitests)
  # The multi-rank GPU tests at 2 and 4 ranks sharing the GPU over MPI.
  step pytest gpu multi-rank
  timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_mpi.py -k "gpu and (2 or 4)" 2>&1 | tee "$OUT/pytest_mpi_gpu.txt" | tail -25 ;;
sweep)
  # A short 4-rank AllReduce sweep on the GPU over MPI: every schedule and codec, checked.
  step 4-rank MPI sweep on the GPU
  timeout 300 python3 -m coccl.bench.cli allreduce --np 4 --device gpu -b 1M -e 256M -f 4 -n 5 -w 2 --no-progress \
    --algorithm ring,two_shot --compressor identity,taco,int8 -d float32 \
    --json "$OUT/mpi4.json" 2>&1 | tee "$OUT/sweep.txt" | tail -40 ;;
tpkernels)
  # Issue #33: the TP codecs' kernels at TP sizes beside a copy of the same bytes at the
  # same size (size_fraction), the encode's launch configurations at 16M and 4M, and
  # ncu's view of each taco kernel at 4M bfloat16 elements (NCU_COUNT).
  step TP-size codec kernels
  timeout 240 python3 -m coccl.bench.cli codec --device gpu --counts 1M,4M,16M,64M,256M \
    --compressor taco,int8 -d bfloat16,float32 -n 25 -c 0 \
    --json "$JSONDIR/tp-kernels.json" 2>&1 | tee "$OUT/tpkernels_log.txt" | tail -90
  timeout 150 python3 -m coccl.bench.cli codec --device gpu --counts 4M,16M,64M \
    --compressor int,int:bits=4,hadamard=32,mx,tah:row=4096 -d bfloat16,float32 -n 15 -c 0 \
    --json "$JSONDIR/tp-kernels-others.json" 2>&1 | tee "$OUT/tpkernels_others_log.txt" | tail -60
  timeout 150 python3 -m coccl.bench.cli codec --device gpu --counts 16M --compressor taco \
    -d bfloat16,float32 -n 25 -c 0 --tuning --json "$JSONDIR/tp-kernels-tuning.json" 2>&1 \
    | tee "$OUT/tpkernels_tuning_log.txt" | grep -v "^ taco  *decode" | tail -60
  for op in encode decode decode_accumulate hop; do
    echo "--- ncu taco $op ${NCU_COUNT:-4M} bfloat16"
    timeout 90 ncu --clock-control none -k regex:coccl_codec --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
      --section SchedulerStats python3 bench/scripts/codec_kernel_probe.py $op --count ${NCU_COUNT:-4M} \
      > "$OUT/ncu-taco-$op.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Compute \(SM\)|Issue Slots Busy|Achieved Occupancy|Registers Per|Executed Instructions  |No Eligible|Warp Cycles Per Issued|Theoretical Occ|Grid Size|Block Size|Waves Per SM" "$OUT/ncu-taco-$op.txt" | head -20
  done ;;
tpprofile)
  # Issue #33: where the taco kernels' time goes at TP sizes: ncu's executed instructions
  # by opcode and stall reasons, the SASS of each variant, the hop kernels side by side.
  step TP-size kernel profile
  M="gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active"
  M="$M,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed"
  M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sass__inst_executed_per_opcode"
  for spec in "hop 16M" "hop 64M" "encode 16M" "decode 16M" "encode 64M"; do
    set -- $spec
    timeout 90 ncu --clock-control none -k regex:coccl_codec --launch-skip 3 --launch-count 1 \
      --metrics "$M" --print-metric-instances values \
      python3 bench/scripts/codec_kernel_probe.py $1 --count $2 > "$OUT/ncu-m-$1-$2.txt" 2>&1
    echo "--- $spec"; grep -E "duration|inst_executed.sum|issue_active|warps_active|dram__|stalled_(long|short|wait|math|mio|lg|barrier|not_sel|selected|no_inst|branch|dispatch|drain|imc|membar|sleep|tex)" "$OUT/ncu-m-$1-$2.txt" | head -30
  done
  for spec in "hop 64M" "hop 16M" "encode 16M" "decode 16M"; do
    set -- $spec
    timeout 120 python3 bench/scripts/sass_dump.py $1 --count $2 --out "$OUT/sass" 2>&1 | tail -4
  done
  timeout 120 python3 bench/scripts/hop_probe.py --out "$OUT/hop-probe.json" --sizes 4M,16M,64M \
    --dtype bfloat16 --grids 16,4 2>&1 | tail -30 ;;
tacofinal)
  # The taco GPU tests, all of them, then the TP-size sweep of the final defaults.
  step taco kernel tests
  timeout 450 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu.py -k "taco" 2>&1 \
    | tee "$OUT/pytest_taco.txt" | tail -6
  step TP-size sweep
  timeout 120 python3 -m coccl.bench.cli codec --device gpu --counts 1M,4M,16M,64M,256M \
    --compressor taco,int8 -d bfloat16,float32 -n 25 -c 1 \
    --json "$JSONDIR/tp-kernels.json" 2>&1 | tee "$OUT/tpkernels_log.txt" | grep -E "^ taco|Out of" ;;
tune)
  # The codec kernels' throughput and launch configurations only (no checks).
  step codec tuning and throughput
  timeout 240 python3 -m coccl.bench.cli codec --device gpu --counts 64M,256M -d bfloat16 \
    --compressor taco,int8 -n 25 -c 0 --tuning --json "$JSONDIR/codec-tuning.json" 2>&1 | tee "$OUT/codec_log.txt" | tail -45 ;;
nccltests)
  # The NCCL tests: one rank, then one GPU per rank.
  step "pytest NCCL: one rank, then one GPU per rank"
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_nccl.py tests/test_mpi.py -k "nccl" 2>&1 | tee "$OUT/pytest_nccl.txt" | tail -8 ;;
mpitests_all)
  # The multi-rank GPU tests at every rank count (1-4).
  step pytest gpu multi-rank, 1-4 ranks
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_mpi.py -k gpu 2>&1 | tee "$OUT/pytest_mpi_gpu.txt" | tail -8 ;;
sweeps)
  # The recorded 4-rank sweeps: 1 MiB to 1 GiB per dtype (SWEEP_DTYPES), every schedule and
  # codec, with the overlap efficiency of each compressed schedule from 64 MiB on.
  for dt in ${SWEEP_DTYPES:-float32 bfloat16}; do
    step "4-rank MPI sweep on the GPU, $dt, with overlap"
    timeout ${SWEEP_TIMEOUT:-290} python3 -m coccl.bench.cli allreduce --np 4 --device gpu -b 1M -e 1G -f 4 -n ${SWEEP_ITERS:-4} -w 1 --no-progress \
      --algorithm ring,two_shot --compressor identity,taco,int8 -d $dt --overlap-min 64M \
      --overlap-iters ${SWEEP_OVERLAP_ITERS:-15} --json "$JSONDIR/mpi4-$dt.json" 2>&1 | tee "$OUT/sweep-$dt.txt" | grep -v "^#  Rank" | tail -24
  done ;;
chunks)
  # The pipeline chunk size's effect on 4-rank taco AllReduce at 256 MiB.
  for cb in 4M 16M; do
    step "4-rank two_shot taco, 256 MiB float32, chunks of $cb"
    timeout 90 python3 -m coccl.bench.cli allreduce --np 4 --device gpu -b 256M -e 256M -n 5 -w 1 --no-progress \
      --algorithm two_shot,ring --compressor taco -d float32 --overlap-min 64M --chunk-bytes $cb \
      --json "$JSONDIR/mpi4-chunks-$cb.json" 2>&1 | grep -v "^#  Rank" | tail -5
  done ;;
probe)
  # The staged pipeline's overlap over a grid of settings (bench/scripts/overlap_probe.py).
  step "4-rank overlap probe: ${PROBE_ARGS:-defaults}"
  timeout ${PROBE_TIMEOUT:-200} mpiexec --oversubscribe -n 4 python3 bench/scripts/overlap_probe.py \
    --out "$JSONDIR/probe-${PROBE_NAME:-1}.json" ${PROBE_ARGS:-} 2>&1 | grep -v "^#  Rank" | tail -80 ;;
latency)
  # Small sizes, two_shot against auto: where auto's thresholds come from.
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
  # Tensor-parallel GPT training smoke test: 2 ranks sharing the GPU over MPI, taco two-shot.
  step "TP GPT smoke on the GPU: 2 ranks sharing it over MPI"
  timeout 150 mpiexec --oversubscribe -n 2 python3 -m mpi4py examples/tp_gpt.py --device cuda --backend mpi \
    --steps 60 --tp-compressor taco --tp-algorithm two_shot --log-every 20 2>&1 | tail -6 ;;
codecs2)
  # The int, tah, mx and taco_fp codecs' GPU kernels against the CPU's, bit for bit, then
  # the taco/int8 kernels' own GPU tests.
  step pytest gpu codecs: int, tah, mx, taco_fp, then taco and int8
  timeout ${CODEC_TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider tests/test_codec_gpu_int.py \
    tests/test_codec_gpu_tah.py tests/test_codec_gpu_mx.py tests/test_codec_gpu.py \
    2>&1 | tee "$OUT/pytest_codecs2.txt" | grep -v "^SKIPPED" | tail -40 ;;
codecbench2)
  # The new codecs' kernels beside taco and int8 and the device copy, checked against the CPU.
  step codec kernels: int, tah, mx, taco_fp beside taco and int8
  timeout ${CODEC_BENCH_TIMEOUT:-200} python3 -m coccl.bench.cli codec --device gpu --counts 4M,16M,64M,256M \
    -d bfloat16 -n 10 --compressor taco,int8,int,int:bits=8,int:bits=4,hadamard=32,int:bits=6,group_size=32,tah:row=4096,mx,mx:element=e3m2,mx:element=e2m1,block=16,scale=e4m3,taco_fp,taco_fp:element=e3m2 \
    --json "$JSONDIR/codec2.json" 2>&1 | tee "$OUT/codec2_log.txt" | tail -60 ;;
tpstep)
  # One GPU: a TP block's compute, the codecs' cost on its messages, the TP=2 prediction.
  step tp-step on one GPU, predictions per link
  timeout ${TPSTEP_TIMEOUT:-200} python3 -m coccl.bench.cli tp-step --np 1 --device gpu --model gpt-6.7b,gpt-2.7b \
    --seq 2048,4096 --compressor identity,taco,int8 --json "$JSONDIR/tp-step-predict.json" 2>&1 \
    | tee "$OUT/tpstep_log.txt" | tail -40 ;;
mxtests)
  # The mx/taco_fp GPU kernels against the CPU's, stopping at the first difference.
  step pytest gpu mx and taco_fp
  timeout 120 python3 -m pytest -q -x --tb=short -p no:cacheprovider tests/test_codec_gpu_mx.py \
    2>&1 | tee "$OUT/pytest_mx.txt" | grep -v "^SKIPPED" | tail -40 ;;
mxkernels)
  # The restructured mx/taco_fp kernels (a lane per chunk, shuffles per block): every kernel
  # variant of float32 and bfloat16 against the CPU's bit for bit (float16's loads and
  # stores are bfloat16's but for the conversion: left out for time), then their throughput
  # beside the device copy at 4M-64M. Budget: at most 120 s, about 100 s expected.
  step pytest gpu mx and taco_fp kernels
  timeout 60 python3 -m pytest -q -x --tb=short -p no:cacheprovider tests/test_codec_gpu_mx.py -k "not float16" \
    2>&1 | tee "$OUT/pytest_mxkernels.txt" | grep -v "^SKIPPED" | tail -20
  step codec kernels: mx, taco_fp
  timeout 60 python3 -m coccl.bench.cli codec --device gpu --counts 4M,16M,64M \
    --compressor mx,mx:element=e3m2,mx:element=e2m1,block=16,scale=e4m3,taco_fp -d bfloat16,float32 \
    -n 11 -c 0 --json "$JSONDIR/mxkernels.json" 2>&1 | tee "$OUT/mxkernels_log.txt" | tail -40 ;;
layers)
  # After the move into layers: one-rank NCCL, graph rebasing, NCCL graphs and torch streams
  # on one rank, staged MPI collectives on 2 and 4 ranks sharing the GPU, the 3D step's capture.
  step pytest gpu: one-rank NCCL, graph rebasing
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_nccl.py tests/test_graph_rebase.py \
    tests/test_train3d_example.py 2>&1 | tee "$OUT/pytest_layers1.txt" | grep -v "^SKIPPED" | tail -8
  step pytest gpu: NCCL and torch streams on one rank, staged MPI on 2 and 4 ranks
  timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_mpi.py \
    -k "(nccl and 1]) or (test_torch_backend_gpu and 1]) or (test_gpu_collectives and (2] or 4]))" \
    2>&1 | tee "$OUT/pytest_layers2.txt" | grep -v "^SKIPPED" | tail -12 ;;
callergraph)
  # coccl calls inside CUDA graphs the caller captures (CuPy, torch.cuda.graph,
  # torch.compile reduce-overhead) on one-rank NCCL, and the refusals; then the graph-safety
  # tests the recording path touches. Budget: about 120 s.
  step pytest gpu: CUDA graphs of the caller
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/test_caller_graph_gpu.py tests/test_graph_safe.py \
    2>&1 | tee "$OUT/pytest_callergraph.txt" | grep -v "^SKIPPED" | tail -30 ;;
compile)
  # torch.compile(mode="reduce-overhead") of TP steps on one-rank NCCL coccl groups, an
  # exact group's and a taco group's one after the other (cudagraph trees restore each
  # other's pool snapshots), bitwise against the same steps compiled without CUDA graphs;
  # a recorded call holds none of the caller's tensors; the global-mode captures, whose
  # allocations now run with the thread in relaxed mode. Budget: about 90 s (the compiles).
  step pytest gpu: torch.compile reduce-overhead
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/test_caller_graph_gpu.py \
    -k "compile or keeps_no_reference or global" \
    2>&1 | tee "$OUT/pytest_compile.txt" | grep -v "^SKIPPED" | tail -30 ;;
ncclp2p)
  # Point-to-point over NCCL (one rank sending to itself inside NCCL groups), then on 2 and 4
  # ranks sharing the GPU over staged MPI: the send/recv sweep (identity, tah, taco beside
  # MPI_Sendrecv, overlap from 64 MiB), the all-to-all sweep (beside MPI_Alltoall) and the
  # two-level AllReduce on 2 emulated nodes of 2 ranks (beside MPI_Allreduce). Budget: 200 s
  # (the four timeouts); JSON in $JSONDIR.
  step "pytest one-rank NCCL point-to-point"
  timeout ${P2P_TEST_TIMEOUT:-60} python3 -m pytest -q -p no:cacheprovider tests/test_nccl_p2p.py \
    2>&1 | tee "$OUT/pytest_nccl_p2p.txt" | grep -v "^SKIPPED" | tail -15
  step "2-rank staged send/recv sweep on the GPU, 1 MiB to 1 GiB, overlap from 64 MiB"
  timeout ${P2P_SENDRECV_TIMEOUT:-70} python3 -m coccl.bench.cli sendrecv --np 2 --device gpu -b 1M -e 1G -f 4 \
    -n 2 -w 1 --no-progress --compressor identity,tah:row=4096,taco --overlap-min 64M --overlap-iters 3 \
    --json "$JSONDIR/h200-mpi-2ranks-sendrecv.json" 2>&1 | tee "$OUT/sendrecv.txt" | tail -28
  step "4-rank staged all-to-all sweep on the GPU, 4 to 256 MiB"
  timeout ${P2P_ALLTOALL_TIMEOUT:-35} python3 -m coccl.bench.cli alltoall --np 4 --device gpu -b 4M -e 256M -f 4 \
    -n 2 -w 1 --no-progress --compressor identity,int:bits=4,int:bits=8 \
    --json "$JSONDIR/h200-mpi-4ranks-alltoall.json" 2>&1 | tee "$OUT/alltoall.txt" | tail -20
  step "4-rank staged two-level AllReduce on the GPU, 2 emulated nodes of 2 ranks"
  COCCL_LOCAL_SIZE=2 timeout ${P2P_HIER_TIMEOUT:-35} python3 -m coccl.bench.cli allreduce --np 4 --device gpu \
    -b 4M -e 256M -f 4 -n 2 -w 1 --no-progress --algorithm hierarchical,native --compressor identity,int:bits=8 \
    -d float32 --json "$JSONDIR/h200-mpi-4ranks-hierarchical.json" 2>&1 | tee "$OUT/hierarchical.txt" \
    | grep -v "^#  Rank" | tail -16 ;;
p2psweep)
  # Point-to-point of device data over staged MPI (the codec's
  # kernels on the device's compute stream, each chunk's payload alone staged through pinned
  # memory):
  # the GPU tests it touches (one-rank NCCL point-to-point and the torch backend's CUDA
  # tensors handed to NCCL as they are; tests/mpi/test_p2p_calls.py's device case on 2 ranks
  # sharing the GPU over staged MPI), then the 2-rank staged send/recv sweep 1 MiB to 1 GiB
  # (identity, tah, taco beside MPI_Sendrecv of the same run; overlap from 64 MiB; fewer
  # calls from 256 MiB: --iters-bytes). Budget: 230 s (the timeouts; about 150 s expected).
  step "pytest one-rank NCCL point-to-point, torch CUDA tensors over NCCL"
  timeout ${P2P_TEST_TIMEOUT:-50} python3 -m pytest -q -p no:cacheprovider -rs tests/test_nccl_p2p.py \
    tests/test_torch_p2p.py::test_cuda_tensors_travel_over_nccl_as_they_are \
    2>&1 | tee "$OUT/pytest_p2psweep_nccl.txt" | grep -v "^SKIPPED" | tail -15
  step "pytest staged device point-to-point, 2 ranks sharing the GPU"
  mkdir -p "$OUT/p2p2"
  timeout ${P2P_MPI_TIMEOUT:-40} mpiexec --oversubscribe -n 2 python3 -m mpi4py tests/mpi/rank_main.py \
    "$OUT/p2p2" tests/mpi/test_p2p_calls.py -k device -rs 2>&1 | tail -2
  tail -6 "$OUT/p2p2/rank-0.log" | tee "$OUT/pytest_p2psweep_mpi2.txt"
  step "2-rank staged send/recv sweep on the GPU, 1 MiB to 1 GiB, overlap from 64 MiB"
  timeout ${P2P_SWEEP_TIMEOUT:-140} python3 -m coccl.bench.cli sendrecv --np 2 --device gpu -b 1M -e 1G -f 4 \
    -n 2 -w 1 --iters-bytes 256M --no-progress --compressor identity,tah:row=4096,taco --overlap-min 64M \
    --overlap-iters 3 --json "$JSONDIR/h200-mpi-2ranks-sendrecv.json" 2>&1 | tee "$OUT/p2psweep.txt" | tail -30 ;;
p2psweeps)
  # The 2-rank staged send/recv sweeps of record: float32 and bfloat16 as the ranks share the
  # GPU by default (time-sliced), then float32 under MPS; P2P_DTYPES and P2P_CODECS (the
  # --compressor list) narrow or change them. Budget: about 4 minutes.
  for dt in ${P2P_DTYPES:-float32 bfloat16 mps}; do
    step "2-rank staged send/recv sweep on the GPU, $dt, 1 MiB to 1 GiB, overlap from 64 MiB"
    if [ $dt = mps ]; then mps_start || continue; fi
    timeout 120 python3 -m coccl.bench.cli sendrecv --np 2 --device gpu -b 1M -e 1G -f 4 \
      -n 2 -w 1 --iters-bytes 256M --no-progress -d ${dt/mps/float32} --compressor ${P2P_CODECS:-identity,tah:row=4096,taco} \
      --overlap-min 64M --overlap-iters 3 --json "$JSONDIR/h200-mpi-2ranks-sendrecv-$dt.json" 2>&1 \
      | tee "$OUT/p2psweep-$dt.txt" | grep -v "^#  Rank" | tail -26
    if [ $dt = mps ]; then mps_stop; fi
  done ;;
p2poverlap)
  # Why the staged send/recv's pipelined time exceeds the sum of its halves (codec-only +
  # transport-only): 2 ranks sharing the GPU, tah and taco at 64 and 256 MiB, as the sweep
  # runs them (4 MiB chunks, depth 4), then with chunks of 16 MiB, with depth 8, and
  # under an MPS daemon (the two ranks' kernels side by side instead of time-sliced
  # between their contexts). Budget: about 3 minutes; JSON in $JSONDIR.
  run_p2p() {  # name, then environment assignments
    local name=$1; shift
    step "2-rank staged send/recv, $name"
    env "$@" timeout 90 python3 -m coccl.bench.cli sendrecv --np 2 --device gpu -b 64M -e 256M -f 4 \
      -n 3 -w 1 --no-progress --compressor identity,tah:row=4096,taco --overlap-min 64M --overlap-iters 5 \
      --json "$JSONDIR/h200-p2poverlap-$name.json" 2>&1 | grep -v "^#  Rank" | tail -11
  }
  run_p2p base
  run_p2p chunk16M COCCL_CHUNK_BYTES=16M
  run_p2p depth8 COCCL_PIPELINE_DEPTH=8
  if mps_start; then run_p2p mps; mps_stop; fi ;;
p2pchunks)
  # The staged send/recv's chunk, A/B twice over: compressed float32 messages of 64 and 128
  # MiB in chunks of 8 and 16 MiB (overlap efficiency), identity at 64 and 256 MiB in chunks
  # of 4 and 8 MiB. Budget: about 3 minutes; JSON in $JSONDIR.
  for round in 1 2; do
    for cb in 8M 16M; do
      step "2-rank staged send/recv, tah and taco in chunks of $cb (round $round)"
      COCCL_CHUNK_BYTES=$cb timeout 60 python3 -m coccl.bench.cli sendrecv --np 2 --device gpu -b 64M -e 128M -f 2 \
        -n 3 -w 1 --no-progress --compressor tah:row=4096,taco --overlap-min 64M --overlap-iters 5 \
        --json "$JSONDIR/h200-p2pchunks-lossy-$cb-$round.json" 2>&1 | grep -v "^#" | tail -6
    done
    for cb in 4M 8M; do
      step "2-rank staged send/recv, identity in chunks of $cb (round $round)"
      COCCL_CHUNK_BYTES=$cb timeout 60 python3 -m coccl.bench.cli sendrecv --np 2 --device gpu -b 64M -e 256M -f 4 \
        -n 3 -w 1 --no-progress --compressor identity \
        --json "$JSONDIR/h200-p2pchunks-identity-$cb-$round.json" 2>&1 | grep -v "^#" | tail -4
    done
  done ;;
state)
  # Caller-kept states (#31) on device data: the delta AllGather and error feedback give
  # bitwise the host's results, call after call: 1, 2 and 4 ranks sharing the GPU over
  # staged MPI, and one-rank NCCL (the 1-rank case). Budget: about 4 minutes.
  step "pytest stateful calls on the GPU (1, 2, 4 ranks)"
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_mpi.py \
    -k "test_gpu_state and (1] or 2] or 4])" 2>&1 | tee "$OUT/pytest_gpu_state.txt" | tail -8 ;;
policy3d)
  # examples/train_3d.py on the GPU: one rank (a 1 x 1 x 1 mesh: coccl groups over NCCL,
  # FSDP2's CUDA streams and custom comms, pipelining's stage), none / identity / taco3d;
  # identity's losses must equal none's. Budget: about 3 minutes.
  step "train_3d on one GPU: none, identity, taco3d"
  for pol in none identity taco3d; do
    timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 1 examples/train_3d.py \
      --device cuda --tp 1 --pp 1 --dp 1 --policy $pol --steps 10 --min-compress-bytes 1024 \
      --out "$JSONDIR/train3d-gpu-$pol.json" > "$OUT/train3d-gpu-$pol.log" 2>&1
    tail -4 "$OUT/train3d-gpu-$pol.log"
  done
  python3 -c "import json,sys; l=[json.load(open(f'$JSONDIR/train3d-gpu-{p}.json'))['losses'] for p in ('none','identity')]; print('identity == none:', l[0] == l[1] or max(abs(a-b)/abs(a) for a,b in zip(*l)))" ;;
torchp2p)
  # The torch backend's point-to-point of CUDA tensors, 2 ranks sharing the GPU under
  # torchrun: host-staged messages bitwise, side streams ordered, a 2-stage GPipe on the
  # GPU against the CPU run (tests/scripts/torch_p2p_gpu_cases.py). Budget 60 s.
  step pytest torch point-to-point on the GPU, 2 ranks sharing it
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_torch_p2p.py -k gpu \
    2>&1 | tee "$OUT/pytest_torchp2p.txt" | tail -60 ;;
kernels)
  # The tah and int kernels (issues #30, #31): a subset of their GPU tests, bitwise against
  # the CPU's kernels (every tah variant in bfloat16, row=4096 in float32 (16 elements a
  # lane: four 16-byte loads), the many-token, large, unaligned and graph cases; int at 4,
  # 6 and 8 bits; int8, whose encode runs the int kernel at 8 bits), then their throughput
  # beside the device copy. Budget: 210 s (60 + 40 + 40 + 70).
  step pytest gpu tah and int kernels
  timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_tah.py \
    -k "bfloat16 or many or large or unaligned or graph or float64 or (float32 and 4096)" \
    2>&1 | tee "$OUT/pytest_kernels_tah.txt" | tail -6
  timeout 40 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_int.py \
    -k "b4-g128 or b8-g128 or b6-g32 or b4-g2048" 2>&1 | tee "$OUT/pytest_kernels_int.txt" | tail -6
  timeout 40 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu.py \
    -k "int8 or tuning or codec_classes" 2>&1 | tee "$OUT/pytest_kernels_int8.txt" | tail -6
  step tah and int throughput
  timeout 70 python3 -m coccl.bench.cli codec --device gpu --counts 4M,16M,64M,256M \
    --compressor int:bits=4,int:bits=8,int8,tah:row=4096 -d bfloat16,float32 -n 15 -c 0 \
    --json "$JSONDIR/kernels.json" 2>&1 | tee "$OUT/kernels_log.txt" | tail -70 ;;
nb)
  # Nonblocking collectives and buckets on device arrays (tests/mpi/test_gpu_nonblocking.py):
  # one rank (staged MPI and one-rank NCCL), then two ranks sharing the GPU (staged MPI).
  # Budget: 60 s.
  step pytest gpu: nonblocking calls and buckets on 1 and 2 ranks
  for n in 1 2; do
    mkdir -p "$OUT/nb$n"
    timeout $((15 + 15 * n)) mpiexec --oversubscribe -n $n python3 -m mpi4py tests/mpi/rank_main.py \
      "$OUT/nb$n" tests/mpi/test_gpu_nonblocking.py -rs 2>&1 | tail -2
    tail -6 "$OUT/nb$n/rank-0.log" | tee "$OUT/pytest_nb$n.txt"
  done ;;
p2pdp)
  # Point-to-point and the DP calls on device data over staged MPI, 1-4 ranks sharing the
  # GPU (the CuPy cases of tests/mpi/test_p2p_calls.py and test_dp_calls.py, with the
  # files' host cases). Budget: about 3 minutes.
  step "pytest p2p and DP calls on device data, 1-4 ranks"
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_mpi.py -k "test_dp_calls or test_p2p_calls" \
    2>&1 | tee "$OUT/pytest_p2pdp.txt" | tail -8 ;;
dpgpu)
  # DP on CUDA tensors through the torch backend, one rank over one-rank NCCL
  # (tests/mpi/test_torch_backend_gpu.py): a compressed all_to_all_single bitwise the host
  # codec's roundtrip, FSDP2 with coccl.torch.shard_comms (delta gather, feedback reduce).
  # Budget: 60 s.
  step pytest gpu: torch all_to_all_single and FSDP2 comms on CUDA, one rank
  mkdir -p "$OUT/dpgpu"
  timeout 60 mpiexec --oversubscribe -n 1 python3 -m mpi4py tests/mpi/rank_main.py "$OUT/dpgpu" \
    tests/mpi/test_torch_backend_gpu.py -k "cuda or nccl" -rs 2>&1 | tail -2
  tail -8 "$OUT/dpgpu/rank-0.log" | tee "$OUT/pytest_dpgpu.txt" ;;
frontier)
  # The TP frontier of the 4-6-bit codecs (issue #33, helper frontier): 8 arms at TP = 4,
  # taco at TP = 4 and 8, the plain model, 5 seeds each (55 runs of 2000 steps on virtual
  # TP ranks, 10 workers under MPS). The runs stop at a checkpoint at the time limit and
  # the report holds the finished ones; the same part again resumes (a warm machine keeps
  # the work folder). Budget: one call of 540 s (~460 s expected).
  step "TP frontier: bytes per element against loss"
  timeout ${FRONTIER_TIMEOUT:-530} python3 examples/tp_convergence_gpu.py frontier --tps 4,8 \
    --only 8=taco --seeds 0,1,2,3,4 --jobs-per-gpu 10 --time-limit-s ${FRONTIER_LIMIT_S:-480} \
    --work-dir /tmp/coccl-tp-frontier-gpu --out "$JSONDIR/tp-frontier-gpu.json" 2>&1 \
    | tee "$OUT/tp_frontier_log.txt" | tail -40 ;;
t3dseeds)
  # Issue #32's 3D table with more seeds: uncompressed, taco3d and taco3d_pp6 (the PP
  # forward at 6 bits), seeds 0-29, 9 workers under MPS (whole seeds per wave). The runs
  # stop at a checkpoint at the time limit; the same part again resumes on a warm machine,
  # and a fresh machine starts from the finished runs in $T3D_PRIOR (a tar of the work
  # folder, as this part leaves in $OUT). Budget: one call of 600 s.
  step "3D table: uncompressed, taco3d, taco3d_pp6, more seeds"
  W=/tmp/coccl-t3d-seeds
  if [ ! -d $W ] && [ -f "${T3D_PRIOR:-}" ]; then mkdir -p $W && tar xzf "$T3D_PRIOR" -C $W; fi
  timeout ${T3D_TIMEOUT:-560} python3 examples/train3d_convergence_gpu.py run \
    --arms uncompressed,taco3d,taco3d_pp6 --seeds "$(seq -s, 0 29)" --jobs-per-gpu 9 \
    --time-limit-s ${T3D_LIMIT_S:-520} --work-dir $W \
    --out "$JSONDIR/tp3d-convergence-gpu-seeds.json" 2>&1 | tee "$OUT/t3d_log.txt" | tail -30
  tar czf "$OUT/t3d-runs.tgz" -C $W --exclude='*.ckpt' . ;;
t3dpp4h)
  # Issue #32's 3D table, one more arm: taco3d with the PP forward as int 4 bits in groups of
  # 32 after a 32-point Hadamard (tah's bytes), seeds PP4H_FIRST..PP4H_LAST (0-8: one wave of
  # 9 workers under MPS; the record ran 0-8, then 9-17),
  # paired afterwards with the recorded uncompressed runs of the same seeds
  # (tp3d-convergence-gpu-seeds.json: that arm uses no codec and reproduced bitwise).
  step "3D table: taco3d_pp4h"
  timeout ${T3D_TIMEOUT:-380} python3 examples/train3d_convergence_gpu.py run \
    --arms taco3d_pp4h --seeds "$(seq -s, ${PP4H_FIRST:-0} ${PP4H_LAST:-8})" --jobs-per-gpu 9 \
    --time-limit-s ${T3D_LIMIT_S:-330} --work-dir /tmp/coccl-t3d-pp4h \
    --out "$JSONDIR/tp3d-convergence-gpu-pp4h.json" 2>&1 | tee "$OUT/t3d_pp4h_log.txt" | tail -20 ;;
mxstores)
  # The mx decodes whose lane writes more than 16 bytes (float32; FP6 bfloat16) store a
  # warp's span through shared memory: the GPU tests (bitwise the CPU's), then the TP-size
  # kernels beside a copy of the same bytes (MXFP4, MXFP6 e2m3, NVFP4).
  step "mx kernels: GPU tests and TP sizes"
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_mx.py 2>&1 \
    | tee "$OUT/pytest_gpu_mx.txt" | tail -4
  timeout 150 python3 -m coccl.bench.cli codec --device gpu --counts 4M,16M,64M,256M \
    --compressor mx,mx:element=e2m3,mx:element=e2m1,block=16,scale=e4m3 \
    -d bfloat16,float32 -n 15 -c 0 --json "$JSONDIR/mx-kernels.json" 2>&1 \
    | tee "$OUT/mx_kernels_log.txt" | tail -60 ;;
tpseeds)
  # Issue #33's frontier candidates with more seeds: uncompressed, taco, nvfp4,
  # fwd_mxfp6_bwd_nvfp4 and mxfp6 at TP = 4, seeds 0-26, 10 workers under MPS. A fresh
  # work folder starts from the 5-seed report's runs (prepopulate_runs.py) but for
  # nvfp4's seed 0, which runs again (did the earlier runs reproduce?), or from the runs
  # in $TPS_PRIOR (a tar of the work folder, as this part leaves in $OUT). The runs stop
  # at a checkpoint at the time limit; the same part again resumes. Budget: 600 s a call.
  step "TP frontier candidates, more seeds"
  W=/tmp/coccl-tp-seeds
  work_folder $W "${TPS_PRIOR:-}" nvfp4-tp4-seed0 bench/results/tp-frontier-gpu.json
  frontier_runs $W tp-frontier-gpu-seeds.json tps --tps 4 \
    --arms uncompressed,taco,nvfp4,fwd_mxfp6_bwd_nvfp4,mxfp6 --seeds "$(seq -s, 0 26)" ;;
tp8seeds)
  # Issue #33's frontier at TP = 8 too: taco, mxfp6 and fwd_mxfp6_bwd_nvfp4 at TP = 8 for
  # as many seeds as the time allows, in the same work folder and report as tpseeds (the
  # TP = 4 runs, and taco's TP = 8 seeds 0-4, are written in first from the recorded
  # reports; runs go seed by seed, so a cut-off table still pairs its arms). NVFP4 on
  # both directions, which misses at TP = 4, is not run at TP = 8. Resumes like tpseeds.
  step "TP frontier candidates at TP = 8"
  W=/tmp/coccl-tp-seeds
  work_folder $W "${TPS_PRIOR:-}" "" bench/results/tp-frontier-gpu.json \
    bench/results/tp-frontier-gpu-seeds.json
  frontier_runs $W tp-frontier-gpu-seeds.json tp8 --tps 4,8 \
    --only 8=taco+mxfp6+fwd_mxfp6_bwd_nvfp4 \
    --arms uncompressed,taco,nvfp4,fwd_mxfp6_bwd_nvfp4,mxfp6 --seeds "$(seq -s, 0 26)" ;;
nvfp4real)
  # The NVFP4 arms again with the simulator's payload-scoped path (one payload, one
  # float32 scale S, per rank and shard, as a real group sends; the recorded runs had one
  # S per AllReduce step): the frontier's fewest-bytes arm, fwd_mxfp6_bwd_nvfp4, at TP = 4
  # and 8, seed by seed (54 runs, ~800 s of the GPU); the other arms' runs are written in
  # from the seeds report. A new report beside it; resumes from $NVFP4_PRIOR (not
  # $TPS_PRIOR: a tar of tpseeds' folder holds the old NVFP4 runs, which the runner,
  # comparing setups only, would take as finished). First the GPU simulation of NVFP4's
  # payloads against the CPU's: a failure stops the part before any run.
  step "NVFP4 arms with per-shard scales"
  timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_virtual_ranks.py \
    -k "gpu_payload_scoped" > "$OUT/pytest_payload_scoped.txt" 2>&1
  rc=$?; tail -3 "$OUT/pytest_payload_scoped.txt"
  [ $rc -eq 0 ] || { echo "the GPU payload-scoped simulation failed: no runs"; exit 1; }
  W=/tmp/coccl-tp-nvfp4
  redo=$(for t in 4 8; do for s in $(seq 0 26); do
    printf 'fwd_mxfp6_bwd_nvfp4-tp%s-seed%s,' $t $s; done; done)
  work_folder $W "${NVFP4_PRIOR:-}" "$redo" bench/results/tp-frontier-gpu-seeds.json
  frontier_runs $W tp-frontier-gpu-nvfp4.json nvfp4 --tps 4,8 \
    --only 8=taco+mxfp6+fwd_mxfp6_bwd_nvfp4 \
    --arms uncompressed,taco,fwd_mxfp6_bwd_nvfp4,mxfp6 --seeds "$(seq -s, 0 26)" ;;
kernels22)
  # Session 22's kernel changes (issue #33): the mx bfloat16 E8M0 encode on bf16x2, the
  # NVFP4 (E4M3-scaled) encode without divisions, taco's decode with its cross-lane
  # Hadamard stages transposed through shared memory, the int kernels with a Hadamard.
  # First their throughput beside a copy of the same bytes (so that figures come back
  # whatever the tests do; mx in one report, taco and int in another), then their GPU
  # tests, bitwise the CPU's (on a fresh machine NVRTC compiles most of their time). Budget: ~600 s.
  step "kernels: TP sizes"
  for k in "mx mx,mx:element=e2m3,mx:element=e2m1,block=16,scale=e4m3" \
           "taco_int taco,int:bits=4,hadamard=32"; do
    set -- $k
    timeout 110 python3 -m coccl.bench.cli codec --device gpu --counts 4M,16M,64M,256M \
      --compressor $2 -d bfloat16,float32 -n 15 -c 0 --json "$JSONDIR/kernels22-$1.json" 2>&1 \
      | tee -a "$OUT/kernels22_log.txt" | tail -50
  done
  step "pytest gpu: mx, int, taco decode"
  timeout 190 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_mx.py 2>&1 \
    | tee "$OUT/pytest_k22_mx.txt" | tail -4
  timeout 70 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_int.py 2>&1 \
    | tee "$OUT/pytest_k22_int.txt" | tail -4
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu.py \
    -k "taco_bitwise_vs_cpu or taco_whole_range or taco_unaligned or codec_classes_gpu" 2>&1 \
    | tee "$OUT/pytest_k22_taco.txt" | tail -4 ;;
k23bench)
  # Session 23's kernel changes (issues #30, #31, #33): int (one-wave staged encode,
  # decode loads a tile ahead, the rotated encode's absmax after the transform), taco
  # (32-bit shared addresses, the decode's prefetch, the hop's buffers), tah (loads issued
  # together, codes without conversions, the decode at 32 a lane). Throughput beside a copy
  # of the same bytes first, then the taco hop in 2-warp blocks as an A/B. Budget: ~500 s.
  step "kernels: session 23 (int, taco, tah)"
  for k in "int int,int:bits=4,hadamard=32,int:bits=8" "taco taco" "tah tah:row=4096"; do
    set -- $k
    timeout 130 python3 -m coccl.bench.cli codec --device gpu --counts 4M,16M,64M,256M \
      --compressor $2 -d bfloat16,float32 -n 15 -c 0 --json "$JSONDIR/kernels23-$1.json" 2>&1 \
      | tee -a "$OUT/kernels23_log.txt" | tail -40
  done
  step "A/B: taco hop in 2-warp blocks, 128 a lane"
  timeout 110 python3 bench/scripts/kernel_ab.py --compressor taco --counts 4M,16M,64M,256M \
    --ops hop --rounds 1 -n 15 --tuning '{"hop_epl": 128, "epl_threads": {"hop": 64}, "epl_resident": {"hop": 256}}' \
    --json "$JSONDIR/kernels23-taco-hop2w-ab.json" 2>&1 | tee "$OUT/k23_ab_log.txt" | tail -20 ;;
k23mx)
  # The mx decodes (session 23), beside a copy of the same bytes. Budget: ~120 s.
  step "kernels: session 23 (mx)"
  timeout 120 python3 -m coccl.bench.cli codec --device gpu --counts 4M,16M,64M,256M \
    --compressor mx,mx:element=e2m3,mx:element=e2m1,block=16,scale=e4m3 -d bfloat16,float32 \
    -n 15 -c 0 --json "$JSONDIR/kernels23-mx.json" 2>&1 | tee -a "$OUT/kernels23_mx_log.txt" | tail -50 ;;
k23floor)
  # The floor of a decode's byte mix (payload in, output out, no arithmetic) beside a copy
  # of the same bytes, and taco's decode with and without its next tile's loads ahead.
  step "decode byte-mix floor; taco decode prefetch A/B"
  timeout 100 python3 bench/scripts/stream_floor.py --counts 16M,64M,256M \
    --compressor taco,int:bits=4,hadamard=32,mx,mx:element=e2m3,tah:row=4096 \
    --json "$JSONDIR/kernels23-floor.json" 2>&1 | tee "$OUT/k23_floor_log.txt" | tail -32
  timeout 80 python3 bench/scripts/kernel_ab.py --compressor taco --counts 16M,64M,256M \
    --ops decode --rounds 2 -n 15 --tuning '{"prefetch": {"decode": 0}}' \
    --json "$JSONDIR/kernels23-taco-prefetch-ab.json" 2>&1 | tee "$OUT/k23_prefetch_log.txt" | tail -26 ;;
k23tests)
  # The GPU tests of session 23's tah and int kernels, bitwise the CPU's (NVRTC compiles
  # most of their time on a fresh machine). Budget: ~200 s.
  step "pytest gpu: tah, int"
  timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_tah.py 2>&1 \
    | tee "$OUT/pytest_k23_tah.txt" | tail -4
  timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_int.py 2>&1 \
    | tee "$OUT/pytest_k23_int.txt" | tail -4 ;;
k23tests2)
  # The GPU tests of session 23's taco and mx kernels. Budget: ~400 s.
  step "pytest gpu: taco, mx"
  timeout 220 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu.py -k "taco and \
(bitwise_vs_cpu or whole_range or unaligned or several_tiles or hop or encode_kernels_agree)" 2>&1 \
    | tee "$OUT/pytest_k23_taco.txt" | tail -4
  timeout ${MX_TESTS_S:-180} python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_mx.py 2>&1 \
    | tee "$OUT/pytest_k23_mx.txt" | tail -4 ;;
k23b_mx|k23b_int|k23b_tah|k23b_ncu)
  # Session 23's second round: the mx and int decodes' stores; tah's multi-block selection
  # (tah_gpu._SELECT_MULTI, on by default) against the one-block one; ncu's time per tah
  # encode launch at 256M bfloat16 (one-block selection, then multi-block).
  step "kernels: session 23, round 2 ($part)"
  case $part in
  k23b_mx)
    timeout 110 python3 -m coccl.bench.cli codec --device gpu --counts 4M,16M,64M,256M \
      --compressor mx,mx:element=e2m3,mx:element=e2m1,block=16,scale=e4m3 -d bfloat16,float32 \
      -n 15 -c 0 --json "$JSONDIR/kernels23b-mx.json" 2>&1 | tee -a "$OUT/k23b_log.txt" | tail -50 ;;
  k23b_int)
    timeout 90 python3 -m coccl.bench.cli codec --device gpu --counts 4M,16M,64M,256M \
      --compressor int,int:bits=4,hadamard=32 -d bfloat16,float32 \
      -n 15 -c 0 --json "$JSONDIR/kernels23b-int.json" 2>&1 | tee -a "$OUT/k23b_log.txt" | tail -34 ;;
  k23b_tah)
    for sel in True False; do
      timeout 70 python3 -c "import sys, coccl.compressors.tah_gpu as m; m._SELECT_MULTI = $sel; \
from coccl.bench.cli import main; sys.exit(main(sys.argv[1:]))" codec --device gpu \
        --counts 4M,16M,64M,256M --compressor tah:row=4096 -d bfloat16,float32 -n 15 -c 0 \
        --json "$JSONDIR/kernels23b-tah-multi$sel.json" 2>&1 | tee -a "$OUT/k23b_log.txt" | tail -26
    done ;;
  k23b_ncu)
    command -v ncu >/dev/null || { echo "no ncu"; continue; }
    for sel in False True; do
      timeout 45 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:tah_kernel \
        --launch-skip 6 --launch-count 6 python3 -c "import sys, coccl.compressors.tah_gpu as m; \
m._SELECT_MULTI = $sel; sys.argv[1:] = ['encode', '--count', '256M', '--compressor', 'tah:row=4096', '--launches', '3']; \
import runpy; runpy.run_path('bench/scripts/codec_kernel_probe.py', run_name='__main__')" \
        >> "$OUT/k23b_ncu.txt" 2>&1
      # ncu's whole output is kept (session 23's run filtered it and printed nothing: ncu
      # failed within seconds, why unknown); the launches' times, or its last lines.
      grep -E "tah_kernel|gpu__time_duration" "$OUT/k23b_ncu.txt" | tail -14 || tail -8 "$OUT/k23b_ncu.txt"
    done ;;
  esac ;;
t23_tah|t23_int|t23_mx|t23_taco)
  # The GPU tests of session 23's kernels, bitwise the CPU's; t23_taco: the several-tiles,
  # hop and whole-range cases (the rest of k23tests2's selection passed before its time ran
  # out). NVRTC compiles most of their time on a fresh machine.
  step "pytest gpu: $part"
  case $part in
  t23_tah) timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_tah.py ;;
  t23_int) timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_int.py ;;
  t23_mx) timeout ${MX_TESTS_S:-200} python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_mx.py ;;
  t23_taco) timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu.py -k "taco and \
(several_tiles or hop_kernels_agree or whole_range or hop_with_decoded)" ;;
  esac 2>&1 | tee "$OUT/pytest_$part.txt" | tail -4 ;;
k23b_mxpf)
  # (Ran at f7dd43a; 4bf0acb took the loads-ahead ring out again, so the switch is gone.)
  # The mx lean decodes with their loads 2 grid steps ahead (mx_gpu._DECODE_LOADS_AHEAD,
  # the default) against 1 (the kernel before), beside a copy of the same bytes.
  step "kernels: mx decodes, loads ahead 2 / 1"
  for pf in 2 1; do
    timeout 80 python3 -c "import sys, coccl.compressors.mx_gpu as m; m._DECODE_LOADS_AHEAD = $pf; \
from coccl.bench.cli import main; sys.exit(main(sys.argv[1:]))" codec --device gpu \
      --counts 16M,64M,256M --compressor mx,mx:element=e2m3,mx:element=e2m1,block=16,scale=e4m3 \
      -d bfloat16,float32 -n 15 -c 0 --json "$JSONDIR/kernels23b-mx-pf$pf.json" 2>&1 \
      | tee -a "$OUT/k23b_mx_log.txt" | grep -E " decode  " | tail -18
  done ;;
t23_mxdec|t23_tacorest)
  # t23_mxdec: the mx GPU tests of the decodes (session 23 changed only those); t23_tacorest:
  # the taco cases the two earlier selections did not reach before their time ran out.
  step "pytest gpu: $part"
  case $part in
  t23_mxdec) timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_mx.py -k decode ;;
  t23_tacorest) timeout 230 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu.py \
    -k "taco and (hop_kernels_agree or whole_range)" ;;
  esac 2>&1 | tee "$OUT/pytest_$part.txt" | tail -4 ;;
s24split)
  # Where the tah encode's time goes, launch by launch (CUDA events around each
  # kernel; bench/scripts/launch_times.py), bfloat16 and float32 at 64M and 256M, and the
  # decode beside it.
  step "tah launch split"
  for dt in bfloat16 float32; do for n in 64M 256M; do
    timeout 60 python3 bench/scripts/launch_times.py encode --count $n --dtype $dt \
      --compressor tah:row=4096 2>&1 | tee -a "$OUT/s24split.txt" | tail -8
  done; done
  timeout 60 python3 bench/scripts/launch_times.py decode --count 256M --dtype bfloat16 \
    --compressor tah:row=4096 2>&1 | tee -a "$OUT/s24split.txt" | tail -4 ;;
s24tah)
  # The tah kernels: the GPU tests (bitwise the CPU's), each encode launch's time
  # (bench/scripts/launch_times.py), then the codec rows of record.
  step "pytest gpu: tah"
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_tah.py 2>&1 \
    | tee "$OUT/pytest_s24tah.txt" | tail -4
  step "tah launch split"
  for dt in bfloat16 float32; do
    for n in 64M 256M; do
      timeout 60 python3 bench/scripts/launch_times.py encode --count $n --dtype $dt \
        --compressor tah:row=4096 --json "$JSONDIR/s24-tah-split.json" 2>&1 | tail -7
    done
    timeout 60 python3 bench/scripts/launch_times.py decode --count 256M --dtype $dt \
      --compressor tah:row=4096 --json "$JSONDIR/s24-tah-split.json" 2>&1 | tail -3
  done
  step "tah codec rows"
  timeout 90 python3 -m coccl.bench.cli codec --device gpu --counts 4M,16M,64M,256M \
    --compressor tah:row=4096 -d bfloat16,float32 -n 15 -c 0 \
    --json "$JSONDIR/s24-tah.json" 2>&1 | tail -26 ;;
s24floor)
  # The decodes' byte-mix floor, reads spread through the writes (no division a word now)
  # and phased, beside a copy of the same bytes.
  floor_runs s24-floor- ;;
s24final)
  # The tah kernels with scores on pairs and the decode's look-ahead: the GPU tests,
  # the A/B arms of their switches (tah_gpu._SCORE_PAIRS; _DECODE_AHEAD), the codec rows of
  # record, and the host's launch cost in a call (--launch-cost). Budget: ~450 s.
  step "pytest gpu: tah (whole file)"
  timeout ${TAH_TESTS_S:-260} python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_tah.py \
    2>&1 | tee "$OUT/pytest_s24final.txt" | tail -4
  step "tah scores, pairs on and off"
  for pairs in True False; do
    timeout 60 python3 -c "import sys, runpy, coccl.compressors.tah_gpu as m; m._SCORE_PAIRS = $pairs; \
sys.path.insert(0, 'bench/scripts'); \
sys.argv[1:] = ['encode', '--count', '256M', '--dtype', 'bfloat16', '--compressor', 'tah:row=4096', \
'--json', '$JSONDIR/s24-tah-pairs$pairs.json']; runpy.run_path('bench/scripts/launch_times.py', run_name='__main__')" \
      2>&1 | tail -8
  done
  step "tah decode, look-ahead on and off"
  for ahead in True False; do
    timeout 60 python3 -c "import sys, coccl.compressors.tah_gpu as m; m._DECODE_AHEAD[m._DECODE] = $ahead; \
from coccl.bench.cli import main; sys.exit(main(sys.argv[1:]))" codec --device gpu --counts 64M,256M \
      --compressor tah:row=4096 -d bfloat16,float32 -n 15 -c 0 --json "$JSONDIR/s24-tah-ahead$ahead.json" \
      2>&1 | grep decode | tail -8
  done
  step "tah codec rows of record, with the launch cost"
  timeout 120 python3 -m coccl.bench.cli codec --device gpu --counts 4M,16M,64M,256M \
    --compressor tah:row=4096 -d bfloat16,float16,float32 -n 15 -c 0 --launch-cost \
    --json "$JSONDIR/s24-tah-final.json" 2>&1 | tail -40 ;;
s25prof)
  # Where the kernels that miss issue #33's and #30's bars wait: ncu's speed-of-light,
  # occupancy, scheduler and warp-state sections and every stall reason per issued
  # instruction, one launch each (the probe's first encode and first launch skipped), a
  # copy beside them; then the tah decode's A/B of (elements a lane, blocks an SM,
  # look-ahead), and the host time a codec call costs (cProfile). Budget: ~450 s.
  step "ncu: stall profiles"
  if command -v ncu >/dev/null; then
    ncu_one() {  # tag, kernel regex, launches to skip, probe arguments...
      local tag=$1 k=$2 skip=$3; shift 3
      echo "=== $tag" >> "$OUT/ncu_s25.txt"
      timeout 75 ncu --clock-control none --section SpeedOfLight --section Occupancy \
        --section SchedulerStats --section WarpStateStats --section LaunchStats \
        --section MemoryWorkloadAnalysis \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
        -k "regex:$k" --launch-skip $skip --launch-count 1 "$@" >> "$OUT/ncu_s25.txt" 2>&1
      echo "$tag: $(grep -E 'Duration|Issue Slots Busy' "$OUT/ncu_s25.txt" | tail -2 | tr -s ' ' | tr '\n' ';')"
    }
    P="python3 bench/scripts/codec_kernel_probe.py"
    # uint16 into int16: CuPy's copy kernel (a same-dtype copy is a cudaMemcpy, no kernel)
    ncu_one copy-64M-u16 copy 1 python3 -c "import cupy as cp; x = cp.zeros(64 << 20, cp.uint16); \
y = cp.empty(x.shape, cp.int16); [y.__setitem__(Ellipsis, x) for _ in range(3)]; cp.cuda.runtime.deviceSynchronize()"
    ncu_one taco-hop-bf16-64M coccl_codec 2 $P hop --count 64M --compressor taco --launches 3
    ncu_one taco-encode-bf16-16M coccl_codec 2 $P encode --count 16M --compressor taco --launches 3
    ncu_one taco-decode-bf16-256M coccl_codec 2 $P decode --count 256M --compressor taco --launches 3
    ncu_one tah-decode-bf16-64M tah_kernel 10 $P decode --count 64M --compressor tah:row=4096 --launches 6
    ncu_one tah-tiles-bf16-64M tah_kernel 13 $P encode --count 64M --compressor tah:row=4096 --launches 3
    ncu_one int-h32-decode-f32-256M coccl_int 2 $P decode --count 256M --dtype float32 \
      --compressor int:bits=4,hadamard=32 --launches 3
    ncu_one mx6-decode-bf16-256M coccl_mx 2 $P decode --count 256M --compressor mx:element=e2m3 --launches 3
  else
    echo "no ncu"
  fi
  step "tah decode: elements a lane, blocks an SM, look-ahead"
  for arm in "32 3 True" "16 4 False" "16 5 False" "32 4 False"; do
    set -- $arm
    timeout 60 python3 -c "import sys, coccl.compressors.tah_gpu as m; k = m._DECODE; \
m._EPL[k] = $1; m._TILE_MIN_BLOCKS[k] = $2; m._DECODE_AHEAD[k] = $3; \
from coccl.bench.cli import main; sys.exit(main(sys.argv[1:]))" codec --device gpu --counts 64M,256M \
      --compressor tah:row=4096 -d bfloat16,float32 -n 15 -c 0 --json "$JSONDIR/s25-tah-dec-$1-$2-$3.json" \
      2>&1 | grep -E " decode " | sed "s/^/[$arm] /" | tee -a "$OUT/s25_tahdec.txt"
  done
  step "host cost a call, 4M elements"
  timeout 90 python3 bench/scripts/host_costs.py --count 4M --calls 200 --profile \
    --compressors tah:row=4096,taco,int:bits=4,hadamard=32 2>&1 | tee "$OUT/s25_host.txt" | grep us/call ;;
s25host)
  # tah's launches from plans (host cost a call): the GPU tests (bitwise the CPU's, the
  # switches flipped between calls), the host cost a call of each codec with its profile,
  # then the 2-rank staged send/recv sweep (P2P_DTYPES, default float32). Budget: ~500 s.
  step "pytest gpu: tah (whole file)"
  timeout ${TAH_TESTS_S:-260} python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_tah.py \
    2>&1 | tee "$OUT/pytest_s25host.txt" | tail -4
  step "host cost a call, 4M elements"
  timeout 120 python3 bench/scripts/host_costs.py --count 4M --calls 200 --profile \
    --compressors tah:row=4096,taco,int:bits=4,hadamard=32,mx:element=e2m3 2>&1 \
    | tee "$OUT/s25_host2.txt" | grep us/call
  P2P_DTYPES=${P2P_DTYPES:-float32} bash "$0" p2psweeps ;;
s25last)
  # The tah decode switch tests (the launch plans key on them), taco's encode at 32
  # elements a lane against 64 where it misses (4M-16M bfloat16), and the bfloat16 staged
  # send/recv sweep with tah's launch plans. Budget: ~420 s.
  step "pytest gpu: tah decode switches"
  timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_tah.py \
    -k "decode_switches" 2>&1 | tee "$OUT/pytest_s25last.txt" | tail -3
  step "taco encode: encode_epl 32 A/B"
  timeout 90 python3 bench/scripts/kernel_ab.py --compressor taco --counts 4M,16M,64M \
    --ops encode --tuning '{"encode_epl": 32}' --json "$JSONDIR/s25-taco-encode-epl32-ab.json" \
    2>&1 | tee "$OUT/s25_enc_ab.txt" | tail -12
  P2P_DTYPES=bfloat16 bash "$0" p2psweeps ;;
tahtests)
  # The whole tah GPU test file (bitwise the CPU's): the decodes with and without their
  # table, blocks past their table, the window option's encodes. ~6-7 minutes on a fresh
  # machine (NVRTC compiles).
  step "pytest gpu: tah (whole file)"
  timeout ${TAH_TESTS_S:-540} python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_tah.py \
    2>&1 | tee "$OUT/pytest_tahtests.txt" | tail -3 ;;
tahpre)
  # The tah decode's places from a table (tah_gpu._DECODE_PREFIX, on for the plain decode
  # by default) against the walk over the bitmap, each arm its own process. ~150 s.
  step "tah decode: table off / on"
  for pre in False True; do
    timeout 70 python3 -c "import sys, coccl.compressors.tah_gpu as m; \
m._DECODE_PREFIX.update({m._DECODE: $pre, m._DECODE_ACC: $pre}); \
from coccl.bench.cli import main; sys.exit(main(sys.argv[1:]))" codec --device gpu \
      --counts 16M,64M,256M --compressor tah:row=4096 -d bfloat16,float16,float32 -n 15 -c 0 \
      --json "$JSONDIR/tahpre-$pre.json" 2>&1 | grep -E " decode" | sed "s/^/[table $pre] /"
  done ;;
tahwin)
  # The tah window option (issue #30's encode): the encode for windows (the scores, the
  # selection within windows, the tiles) beside the default's in one run, checked bitwise
  # against the CPU's. ~100 s.
  step "tah encode: default / window 5 / window 8"
  timeout 200 python3 -c "import sys; from coccl.bench.cli import main; sys.exit(main(sys.argv[1:]))" \
    codec --device gpu --counts 4M,16M,64M,256M -d bfloat16,float32 -n 15 \
    --compressor tah:row=4096,tah:row=4096,window=5,tah:row=4096,window=8 \
    --json "$JSONDIR/tahwin.json" 2>&1 | tee "$OUT/tahwin_log.txt" | grep -E " encode|FAIL|rror" ;;
dppair)
  # Issue #31's recipe on 4 staged ranks as 2 emulated nodes of 2: the two-level AllReduce
  # with int8 inside the node and 4-bit int with a 32-point Hadamard across (a codec pair),
  # beside int8 at both levels, identity and the native AllReduce of the same run (staged
  # through the host: ~0.5 s a call at 256M). ~150 s.
  step "4-rank staged two-level AllReduce, the 8-bit / 4-bit pair"
  COCCL_LOCAL_SIZE=2 timeout 260 python3 -m coccl.bench.cli allreduce --np 4 --device gpu \
    -b 4M -e 256M -f 4 -n 5 -w 1 --no-progress --algorithm hierarchical,native \
    --compressor identity,int:bits=8,int8+int:bits=4,hadamard=32 -d ${DPPAIR_DTYPES:-float32,bfloat16} \
    --json "$JSONDIR/h200-mpi-4ranks-hierarchical-pair.json" 2>&1 | tee "$OUT/dppair.txt" \
    | grep -v "^#  Rank" | tail -24 ;;
next23)
  # What session 23 left for the device: the decodes' floor with the payload's reads spread
  # through the writes as a decode's are (against the phased floor of
  # h200-kernels-s23-floor.json) and the whole mx GPU test file at the final code (session
  # 23 ran out of time in it); then part k23b_ncu (ncu's time per tah encode launch).
  # Budget: ~400 s.
  floor_runs floor-
  step "pytest gpu: mx (whole file)"
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_codec_gpu_mx.py 2>&1 \
    | tee "$OUT/pytest_next23_mx.txt" | tail -4 ;;
*)
  echo "unknown part $part" >&2; exit 2 ;;
esac; done
