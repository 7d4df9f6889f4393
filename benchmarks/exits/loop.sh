#!/usr/bin/env bash
# Runs N torchrun jobs of 2 ranks in a row and counts the ones that did not exit 0 on every rank or
# printed "terminate called" (docs/consistency.md#a-run-that-finished-exits-0). Each run in its own
# directory with core dumps on, kept (with its output) when it failed: `gdb python core -batch -ex
# "thread 1" -ex bt` shows the aborting thread.
#
#   benchmarks/exits/loop.sh 100 benchmarks/exits/job.py      # shardcore: TP=2 step + save, no teardown
#   benchmarks/exits/loop.sh 60 benchmarks/exits/plain.py     # torch alone: all-gather, barrier, exit
#
# Load makes the race likelier: run two `yes > /dev/null` or a test suite beside it.
set -u
N=$1; shift
SCRIPT=$(realpath "$1"); shift
PY=${PYTHON_BIN:-$(dirname "$(command -v python)")}
OUT=${OUT:-$(mktemp -d)}
ulimit -c unlimited
ok=0; bad=0
for i in $(seq 1 "$N"); do
  d=$OUT/$i; mkdir -p "$d"; cd "$d" || exit 1
  JOB_OUT=$d/ckpt timeout 300 "$PY/torchrun" --standalone --nproc_per_node 2 "$SCRIPT" "$@" > out.txt 2>&1
  rc=$?
  if [ $rc -ne 0 ] || grep -q "terminate called" out.txt; then
    bad=$((bad + 1)); echo "run $i: exit $rc, $(grep -c 'terminate called' out.txt) 'terminate called' ($d)"
  else
    ok=$((ok + 1)); rm -rf "$d"
  fi
done
echo "exited 0 on every rank: $ok of $N; failed: $bad"
