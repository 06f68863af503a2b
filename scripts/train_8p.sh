#!/usr/bin/env bash
# One node, N cards (8 by default): accelerate + DeepSpeed ZeRO-2. Works unchanged on Ascend NPU
# and CUDA hosts. Extra `a.b=c` arguments are config overrides.
#
#   bash scripts/train_8p.sh --num_processes=8 --max_train_steps=100 --per_device_batch_size=1 \
#        --config=configs/robotwin/dit4dit_robotwin.yaml [framework.cosmos25.base_model=/models/Cosmos-Predict2.5-2B]
#
# Multi-node: the same script on every node with --num_machines=M --machine_rank=R
# --main_process_ip=IP [--main_process_port=P]; --num_processes is per node.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

num_processes=8
max_train_steps=""
per_device_batch_size=""
config=configs/robotwin/dit4dit_robotwin.yaml
num_machines=1
machine_rank=0
main_process_ip=127.0.0.1
main_process_port=29500
overrides=()
for arg in "$@"; do
  case "$arg" in
    --num_processes=*) num_processes="${arg#*=}" ;;
    --max_train_steps=*) max_train_steps="${arg#*=}" ;;
    --per_device_batch_size=*) per_device_batch_size="${arg#*=}" ;;
    --config=*) config="${arg#*=}" ;;
    --num_machines=*) num_machines="${arg#*=}" ;;
    --machine_rank=*) machine_rank="${arg#*=}" ;;
    --main_process_ip=*) main_process_ip="${arg#*=}" ;;
    --main_process_port=*) main_process_port="${arg#*=}" ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    --*) echo "train_8p.sh: unknown flag $arg" >&2; exit 2 ;;
    *) overrides+=("$arg") ;;
  esac
done

PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3

# Ascend defaults (never overriding what the user exported); harmless on CUDA hosts.
export TASK_QUEUE_ENABLE="${TASK_QUEUE_ENABLE:-2}"
export PYTORCH_NPU_ALLOC_CONF="${PYTORCH_NPU_ALLOC_CONF:-expandable_segments:True}"
export CPU_AFFINITY_CONF="${CPU_AFFINITY_CONF:-1}"
export WANDB_MODE="${WANDB_MODE:-offline}"
# Compiled extensions imported before torch fail with "libc10.so: cannot open shared object file":
# put torch's (and torch_npu's, when present) lib folders on the loader path.
libs="$("$PY" - <<'PYEOF'
import importlib.util, os
paths = []
for name in ("torch", "torch_npu"):
    spec = importlib.util.find_spec(name)
    if spec and spec.origin:
        paths.append(os.path.join(os.path.dirname(spec.origin), "lib"))
print(":".join(paths))
PYEOF
)"
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# One rank per physical card: more processes than visible cards fails later inside HCCL/NCCL
# with an obscure "same physical device" / invalid device error, so check it here.
cards="$("$PY" -c 'from dit4dit_npu import device; print(device.device_count() if device.device_type() != "cpu" else 0)')"
if [ "$cards" -gt 0 ] && [ "$num_processes" -gt "$cards" ]; then
  echo "train_8p.sh: --num_processes=$num_processes but only $cards visible card(s) on this node" >&2
  exit 2
fi

[ -n "$max_train_steps" ] && overrides+=("trainer.max_train_steps=$max_train_steps")
[ -n "$per_device_batch_size" ] && overrides+=("datasets.vla_data.per_device_batch_size=$per_device_batch_size")

LOG_DIR="${LOG_DIR:-logs}"
mkdir -p "$LOG_DIR"
LOG_FILE="$LOG_DIR/train_$(date +%Y%m%d_%H%M%S)_rank${machine_rank}.log"
echo "train_8p.sh: $num_processes process(es) x $num_machines machine(s); log: $LOG_FILE"
set -o pipefail
"$PY" -m accelerate.commands.launch \
  --use_deepspeed --num_processes "$((num_processes * num_machines))" \
  --num_machines "$num_machines" --machine_rank "$machine_rank" \
  --main_process_ip "$main_process_ip" --main_process_port "$main_process_port" \
  -m dit4dit_npu.train --config "$config" "${overrides[@]}" 2>&1 | tee "$LOG_FILE"
