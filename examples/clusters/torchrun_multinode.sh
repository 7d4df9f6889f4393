#!/usr/bin/env bash
# One node's launcher of a multi-node run: run it on every node, each with its NODE_RANK (0 on the node
# whose address is MASTER_ADDR). torchrun starts NPROC_PER_NODE ranks here (one per GPU) and meets the
# other nodes' at MASTER_ADDR:MASTER_PORT (c10d rendezvous); shardcore reads the environment torchrun sets.
#
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 bash examples/clusters/torchrun_multinode.sh examples/quickstart.py
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 bash examples/clusters/torchrun_multinode.sh examples/quickstart.py
set -euo pipefail
: "${NNODES:?how many nodes}" "${NODE_RANK:?this node's rank, 0 .. NNODES-1}" "${MASTER_ADDR:?node 0's address}"
MASTER_PORT=${MASTER_PORT:-29500}
NPROC_PER_NODE=${NPROC_PER_NODE:-$(python -c "import torch; print(max(torch.cuda.device_count(), 1))")}
PYTHON=${PYTHON:-python}
exec "$PYTHON" -m torch.distributed.run \
    --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$NPROC_PER_NODE" \
    --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv_id "${RUN_ID:-shardcore}" \
    "$@"
