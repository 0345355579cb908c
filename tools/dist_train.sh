#!/usr/bin/env bash
# Train with torchrun on this node; run it on every node of a multi-node job.
#
#   tools/dist_train.sh CONFIG [train args...]
#   NPROC_PER_NODE=8 tools/dist_train.sh configs/gepo_intern_s1_mini.py --deepspeed deepspeed_zero2
#   # two nodes: on node A (rank 0) and node B, with A's address
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=nodeA tools/dist_train.sh CONFIG --deepspeed deepspeed_zero2
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=nodeA tools/dist_train.sh CONFIG --deepspeed deepspeed_zero2
#
# Train args go to xtuner's training program (--deepspeed, --resume, --work-dir,
# --cfg-options, ...). Environment (torchrun's names):
#   NNODES          nodes (default 1)
#   NODE_RANK       this node's rank, 0 .. NNODES-1 (default 0)
#   NPROC_PER_NODE  processes (= GPUs) on this node (default 8)
#   MASTER_ADDR     host of node rank 0 (default 127.0.0.1; with LMDEPLOY_ADDR_FILE this
#                   node's hostname, because the LMDeploy server must reach it)
#   MASTER_PORT     rendezvous port (default 29500)
#   PYTHON          interpreter with gepo-xtuner installed (default: python)
#   LMDEPLOY_ADDR_FILE  file written by tools/slurm_lmdeploy_server.sh; its
#                   GEPO_LMDEPLOY_URL / GEPO_LMDEPLOY_TP are passed to training
#   DRY_RUN=1       print the command instead of running it
#
# `xtuner train` reads NNODES, NODE_RANK and NPROC_PER_NODE too, but calls the rendezvous
# address ADDR and PORT (a random port when unset) and always exits 0. This script runs
# the same program through gepo-train (`python -m gepo_xtuner_launch`): `python -m
# xtuner.tools.train ... --launcher pytorch` under torchrun (`python -m
# torch.distributed.run`; one process on one node runs without torchrun), with its exit
# status, SIGINT/SIGTERM/SIGHUP passed on, and training stopped if the launcher is killed.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/cluster_common.sh"

(($# >= 1)) || die "usage: $0 CONFIG [train args...]"
config=$1
shift
[[ -f $config ]] || die "config $config does not exist"
nnodes=${NNODES:-1}
node_rank=${NODE_RANK:-0}
nproc=${NPROC_PER_NODE:-8}
master_port=${MASTER_PORT:-29500}
is_count "$nnodes" || die "NNODES must be a positive integer, got '$nnodes'"
is_count "$nproc" || die "NPROC_PER_NODE must be a positive integer, got '$nproc'"
is_count "$master_port" || die "MASTER_PORT must be a port number, got '$master_port'"
if ! [[ $node_rank =~ ^[0-9]+$ ]] || ((node_rank >= nnodes)); then
    die "NODE_RANK must be in 0..$((nnodes - 1)), got '$node_rank'"
fi

cmd=()
if [[ -n ${LMDEPLOY_ADDR_FILE:-} ]]; then
    server=$(server_env "$LMDEPLOY_ADDR_FILE") || exit 2
    mapfile -t server_vars <<<"$server"
    cmd+=(env "${server_vars[@]}")
    master_addr=${MASTER_ADDR:-$(hostname)}
else
    master_addr=${MASTER_ADDR:-127.0.0.1}
fi
cmd+=("${PYTHON:-python}" -m gepo_xtuner_launch --nnodes="$nnodes" --node-rank="$node_rank"
    --nproc-per-node="$nproc" --master-addr="$master_addr" --master-port="$master_port"
    "$config" "$@")
run_cmd "${cmd[@]}"
