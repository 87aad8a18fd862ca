#!/bin/bash
# dflash-train on two 8-GPU nodes under Slurm: one torchrun per node, rendezvous at the first node.
# Submit: sbatch examples/slurm_train.sh   (edit TARGET, DATA, OUTPUT; OUTPUT must be on a shared filesystem)
#SBATCH --job-name=dflash-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
#SBATCH --signal=TERM@120
#SBATCH --requeue
set -euo pipefail

TARGET=${TARGET:-/models/Qwen3-8B}
DATA=${DATA:-/data/chat.jsonl}
OUTPUT=${OUTPUT:-/shared/runs/qwen3-8b-dflash}

HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
RESUME=()
# a requeued job (preempted), or the same script submitted again after the time limit, continues its own run
if [ -f "$OUTPUT/checkpoint/trainer_state.pt" ]; then RESUME=(--resume); fi

# --signal=TERM@120 gives the job's steps SIGTERM two minutes before the limit: torchrun passes it to every rank,
# they agree on the step to stop at, rank 0 saves, and the next job resumes from that step.
srun --kill-on-bad-exit=1 torchrun \
    --nnodes "$SLURM_NNODES" --nproc_per_node 8 \
    --rdzv_id "$SLURM_JOB_ID" --rdzv_backend c10d --rdzv_endpoint "$HEAD:29500" \
    -m dflash_trt.builder.train_cli \
    --target "$TARGET" --data "$DATA" --output "$OUTPUT" "${RESUME[@]}" \
    --device cuda --block-size 16 --num-layers 5 --seqs-per-step 64 --anchors-per-seq 256 \
    --max-seq-len 3072 --max-steps 20000 --full-head --features online
