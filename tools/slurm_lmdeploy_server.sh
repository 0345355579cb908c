#!/usr/bin/env bash
# An LMDeploy rollout server as its own Slurm job, next to the training job.
#
#   tools/slurm_lmdeploy_server.sh PARTITION JOB_NAME MODEL [TP] [lmdeploy args...]
#   tools/slurm_lmdeploy_server.sh gpu gepo-server /models/Intern-S1-mini 2
#
# One srun task on TP GPUs (TP defaults to 1) runs
#   lmdeploy serve api_server MODEL --server-port PORT --backend pytorch \
#       --logprobs-mode raw_logprobs --enable-abort-handling --tp TP [--trust-remote-code]
#       [lmdeploy args...]
# with --trust-remote-code when MODEL's config.json maps its classes to its own code
# (auto_map: Intern-S1-mini), as the trainer loads it (model.trust_remote_code).
# waits until GET /health answers, then writes LMDEPLOY_ADDR_FILE:
#   GEPO_LMDEPLOY_URL=http://HOST:PORT
#   GEPO_LMDEPLOY_TP=TP
# tools/slurm_train.sh and tools/dist_train.sh read that file (set LMDEPLOY_ADDR_FILE for
# them too) and the paper configs then use this server, with weights pushed over NCCL.
# Several servers: start one job per server, each with its own LMDEPLOY_ADDR_FILE in one
# directory, and give LMDeployRolloutBackend address_files='DIR/*.env' (docs/cluster.md).
# The file is removed when the server stops. The job runs until cancelled (scancel).
#
# Environment:
#   LMDEPLOY_ADDR_FILE  where to write the address (default work_dirs/lmdeploy_server.env)
#   LMDEPLOY_PORT       server port (default 23333)
#   LMDEPLOY            the lmdeploy command, e.g. of its own environment (default: lmdeploy)
#   LMDEPLOY_HOST       address written to the file (default: the node's hostname)
#   LMDEPLOY_STARTUP_S  seconds to wait for the server to answer (default 1800)
#   CPUS_PER_TASK       CPU cores (default 16)
#   SRUN_ARGS           more srun options, split on spaces
#   DRY_RUN=1           print the srun command instead of running it (with --on-node: the
#                       lmdeploy command)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/cluster_common.sh"

# On the allocated node: start the server, publish its address once healthy, wait.
serve_on_node() {
    local addr_file=$1 port=$2 model=$3 tp=$4
    shift 4
    local remote=()
    if grep -qs '"auto_map"' "$model/config.json"; then
        remote=(--trust-remote-code)  # the checkpoint ships its own code
    fi
    local cmd=("${LMDEPLOY:-lmdeploy}" serve api_server "$model" --server-port "$port"
        --backend pytorch --logprobs-mode raw_logprobs --enable-abort-handling --tp "$tp" \
        "${remote[@]}" "$@")
    if [[ ${DRY_RUN:-0} == 1 ]]; then
        quote_cmd "${cmd[@]}"
        return 0
    fi
    "${cmd[@]}" &
    local pid=$! waited=0 limit=${LMDEPLOY_STARTUP_S:-1800}
    # shellcheck disable=SC2064  # expand now: pid and file are fixed
    trap "rm -f '$addr_file'; kill $pid 2>/dev/null || true" EXIT INT TERM
    until healthy "http://127.0.0.1:$port/health"; do
        kill -0 "$pid" 2>/dev/null || die "the LMDeploy server exited during start-up (see above)"
        ((waited < limit)) || die "the LMDeploy server did not answer within ${limit}s"
        sleep 2
        waited=$((waited + 2))
    done
    local host=${LMDEPLOY_HOST:-$(hostname)}
    mkdir -p "$(dirname "$addr_file")"
    printf 'GEPO_LMDEPLOY_URL=http://%s:%s\nGEPO_LMDEPLOY_TP=%s\n' "$host" "$port" "$tp" \
        >"$addr_file.tmp.$$"
    mv "$addr_file.tmp.$$" "$addr_file"  # readers never see a half-written file
    echo "LMDeploy server at http://$host:$port (address in $addr_file)"
    wait "$pid"
}

# healthy URL: whether URL answers with HTTP 2xx.
healthy() {
    if command -v curl >/dev/null; then
        curl -sf -o /dev/null --max-time 5 "$1"
    else
        python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
            "$1" 2>/dev/null
    fi
}

if [[ ${1:-} == --on-node ]]; then
    shift
    serve_on_node "$@"
    exit
fi

(($# >= 3)) || die "usage: $0 PARTITION JOB_NAME MODEL [TP] [lmdeploy args...]"
partition=$1
job_name=$2
model=$3
shift 3
tp=1
if (($# > 0)) && [[ $1 =~ ^[0-9]+$ ]]; then
    tp=$1
    shift
fi
is_count "$tp" || die "TP must be a positive integer, got '$tp'"
port=${LMDEPLOY_PORT:-23333}
is_count "$port" || die "LMDEPLOY_PORT must be a port number, got '$port'"
cpus_per_task=${CPUS_PER_TASK:-16}
is_count "$cpus_per_task" || die "CPUS_PER_TASK must be a positive integer, got '$cpus_per_task'"
addr_file=${LMDEPLOY_ADDR_FILE:-work_dirs/lmdeploy_server.env}
[[ $addr_file == /* ]] || addr_file=$PWD/$addr_file  # the job may start elsewhere
script=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
read -r -a srun_args <<<"${SRUN_ARGS:-}"

run_cmd srun -p "$partition" --job-name="$job_name" --gres=gpu:"$tp" --ntasks=1 \
    --cpus-per-task="$cpus_per_task" "${srun_args[@]}" \
    bash "$script" --on-node "$addr_file" "$port" "$model" "$tp" "$@"
