#!/usr/bin/env bash
# MPS supervision on a real GPU: the supervisor with --mps around a CUDA client (the fake
# server doing torch matmuls at start and per warm-up request), SIGTERM, nothing left behind.
# Run from the repository root on a machine with nvidia-smi and nvidia-cuda-mps-control:
#   bash tests/serving/gpu_mps_run.sh        (log in $OUT/mps-supervision.log)
set -u
OUT=${OUT:-/tmp/mps-run}
mkdir -p "$OUT"
{
export PYTHONPATH=$PWD/runtime:$PWD/operator PYTHONUNBUFFERED=1
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
export MINICPM_SPEECH_RUN_DIR=/tmp/msr FAKE_CUDA=1 FAKE_SERVER_LOG=/tmp/server.log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
get() { python3 -c "import sys,urllib.request as u
try: r=u.urlopen(sys.argv[1],timeout=2); print(r.status); sys.stdout.write(r.read().decode())
except Exception as e: print(getattr(e,'code',0))" "$1"; }
echo "== $(date -u +%FT%TZ) before"; nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__)"
pgrep -a nvidia-cuda-mps || echo "no MPS process"
python3 -m minicpm_speech_runtime.serving.cli serve --health-port 9400 --server-port 8091 \
  --mps --mps-active-thread-percentage 50 --no-precapture -- \
  python3 tests/serving/fake_server.py --port 8091 &
SUP=$!
T0=$(date +%s)
for i in $(seq 1 180); do c=$(get http://127.0.0.1:9400/readyz | head -1); [ "$c" = 200 ] && break; sleep 0.5; done
echo "== readyz $c after $(( $(date +%s) - T0 )) s; livez: $(get http://127.0.0.1:9400/livez | tr '\n' ' ')"
echo "== during: MPS processes"; pgrep -a nvidia-cuda-mps
echo "== during: control queries"; echo get_server_list | nvidia-cuda-mps-control
echo get_default_active_thread_percentage | nvidia-cuda-mps-control
ls -la $CUDA_MPS_PIPE_DIRECTORY
echo "== during: nvidia-smi"; nvidia-smi
echo "== during: metrics"; get http://127.0.0.1:9400/metrics | grep -E "^minicpm_speech_(ready|mps_daemon_up|server_up|warmup)"
echo "== SIGTERM to supervisor $SUP"; kill -TERM $SUP; wait $SUP; echo "supervisor exit status $?"
sleep 1
echo "== after"; pgrep -a nvidia-cuda-mps && echo "MPS PROCESS LEFT" || echo "no MPS process left"
echo get_server_list | nvidia-cuda-mps-control; echo "control query exit status $?"
ls -la $CUDA_MPS_PIPE_DIRECTORY
echo "== server log"; cat /tmp/server.log
echo "== MPS control.log"; cat $CUDA_MPS_LOG_DIRECTORY/control.log
echo "== MPS server.log"; cat $CUDA_MPS_LOG_DIRECTORY/server.log
} 2>&1 | tee "$OUT/mps-supervision.log"
