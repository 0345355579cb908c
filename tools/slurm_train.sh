#!/usr/bin/env bash
# Train with srun: one task per GPU, mmengine's slurm launcher.
#
#   tools/slurm_train.sh PARTITION JOB_NAME CONFIG [GPUS] [train args...]
#   tools/slurm_train.sh gpu gepo configs/gepo_intern_s1_mini.py 8 --deepspeed deepspeed_zero2
#
# GPUS defaults to 8. Train args go to xtuner's training program (--deepspeed, --resume,
# --work-dir, --cfg-options, ...). Environment:
#   GPUS_PER_NODE       GPUs (= tasks) per node (default: GPUS, at most 8)
#   CPUS_PER_TASK       CPU cores per task (default 8)
#   SRUN_ARGS           more srun options, split on spaces (e.g. "--time=2-00:00:00 -w node1")
#   PYTHON              interpreter with gepo-xtuner installed (default: python)
#   LMDEPLOY_ADDR_FILE  file written by tools/slurm_lmdeploy_server.sh; its
#                       GEPO_LMDEPLOY_URL / GEPO_LMDEPLOY_TP are passed to training
#   DRY_RUN=1           print the command instead of running it
#
# The program is the one `xtuner train CONFIG --launcher slurm` runs, started by gepo-train
# (`python -m gepo_xtuner_launch`) because `xtuner train` always exits 0, also when training
# failed; this way Slurm records failures, signals reach training, and a task whose
# launcher is killed stops training (gepo_xtuner_launch.py). Each task first sets
# MASTER_ADDR to the step's first node (training rank 0): mmengine's rendezvous and the
# config's LMDeploy address (GEPO_LMDEPLOY_URL=launch) and NCCL weight sync use it.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/cluster_common.sh"

(($# >= 3)) || die "usage: $0 PARTITION JOB_NAME CONFIG [GPUS] [train args...]"
partition=$1
job_name=$2
config=$3
shift 3
gpus=8
if (($# > 0)) && [[ $1 =~ ^[0-9]+$ ]]; then
    gpus=$1
    shift
fi
is_count "$gpus" || die "GPUS must be a positive integer, got '$gpus'"
[[ -f $config ]] || die "config $config does not exist"
gpus_per_node=${GPUS_PER_NODE:-$((gpus < 8 ? gpus : 8))}
is_count "$gpus_per_node" || die "GPUS_PER_NODE must be a positive integer, got '$gpus_per_node'"
cpus_per_task=${CPUS_PER_TASK:-8}
is_count "$cpus_per_task" || die "CPUS_PER_TASK must be a positive integer, got '$cpus_per_task'"
read -r -a srun_args <<<"${SRUN_ARGS:-}"

cmd=()
if [[ -n ${LMDEPLOY_ADDR_FILE:-} ]]; then
    server=$(server_env "$LMDEPLOY_ADDR_FILE") || exit 2
    mapfile -t server_vars <<<"$server"
    cmd+=(env "${server_vars[@]}")
fi
# Run by each task's shell, not here: the step's node list exists only inside the job step.
# shellcheck disable=SC2016
set_master='MASTER_ADDR=$(scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n 1)'
# shellcheck disable=SC2016
set_master+=' && [ -n "$MASTER_ADDR" ] || { echo "no first node in SLURM_STEP_NODELIST" >&2;'
# shellcheck disable=SC2016
set_master+=' exit 1; }; export MASTER_ADDR; exec "$@"'
cmd+=(srun -p "$partition" --job-name="$job_name" --gres=gpu:"$gpus_per_node"
    --ntasks="$gpus" --ntasks-per-node="$gpus_per_node" --cpus-per-task="$cpus_per_task"
    --kill-on-bad-exit=1 "${srun_args[@]}"
    bash -c "$set_master" slurm_train
    "${PYTHON:-python}" -m gepo_xtuner_launch "$config" --launcher slurm "$@")
run_cmd "${cmd[@]}"
