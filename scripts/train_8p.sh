#!/usr/bin/env bash
# One node, N cards (8 by default): accelerate + DeepSpeed ZeRO-2. Works unchanged on Ascend NPU
# and CUDA hosts. Extra `a.b=c` arguments are config overrides.
#
#   bash scripts/train_8p.sh --num_processes=8 --max_train_steps=100 --per_device_batch_size=1 \
#        --config=configs/robotwin/dit4dit_robotwin.yaml [framework.cosmos25.base_model=/models/Cosmos-Predict2.5-2B]
#
# Multi-node: the same script on every node with --num_machines=M --machine_rank=R
# --main_process_ip=IP [--main_process_port=P]; --num_processes is per node.
# --dry_run: check the counts and this host, print the exports and the launch command, exit.
# Flags take _ or - (--num-processes 8 = --num_processes=8), with = or a space before the value.
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
dry_run=0
overrides=()
# Each flag is taken as --flag=VALUE or --flag VALUE, spelled with _ (accelerate's, the original
# launch script's) or - (the doctor's): --num-processes 8 means --num_processes=8.
while [ "$#" -gt 0 ]; do
  arg="$1"; shift
  case "$arg" in
    --*=*) flag="${arg%%=*}"; value="${arg#*=}"; has_value=1 ;;
    *) flag="$arg"; value=""; has_value=0 ;;
  esac
  case "$flag" in --*) flag="--$(printf '%s' "${flag#--}" | tr - _)" ;; esac
  case "$flag" in
    --num_processes|--max_train_steps|--per_device_batch_size|--config|--num_machines|--machine_rank|--main_process_ip|--main_process_port)
      if [ "$has_value" = 0 ]; then
        if [ "$#" -eq 0 ]; then echo "train_8p.sh: $arg: expected a value ($arg VALUE or $arg=VALUE)" >&2; exit 2; fi
        value="$1"; shift
      fi
      printf -v "${flag#--}" '%s' "$value" ;;
    --dry_run|--help)  # switches: a value (--dry_run=0 meant a dry run all the same) is refused
      if [ "$has_value" = 1 ]; then echo "train_8p.sh: $arg: $flag takes no value" >&2; exit 2; fi
      if [ "$flag" = --help ]; then sed -n '2,11p' "$0"; exit 0; fi
      dry_run=1 ;;
    -h) sed -n '2,11p' "$0"; exit 0 ;;
    --*) echo "train_8p.sh: unknown flag $arg" >&2; exit 2 ;;
    *) overrides+=("$arg") ;;
  esac
done

# Counts are checked here, before anything starts: a typo would otherwise surface as a Python
# traceback from accelerate (or as zero processes).
positive_int() {  # NAME VALUE
  case "$2" in
    ''|*[!0-9]*|0*) echo "train_8p.sh: --$1=$2: expected a positive integer" >&2; exit 2 ;;
  esac
}
positive_int num_processes "$num_processes"
positive_int num_machines "$num_machines"
case "$machine_rank" in
  ''|*[!0-9]*) echo "train_8p.sh: --machine_rank=$machine_rank: expected an integer from 0 to $((num_machines - 1))" >&2; exit 2 ;;
esac
if [ "$machine_rank" -ge "$num_machines" ]; then
  echo "train_8p.sh: --machine_rank=$machine_rank: expected an integer from 0 to $((num_machines - 1))" >&2
  exit 2
fi

PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3

# The device layer (dit4dit_npu/device/) owns the launch environment: it checks one rank per
# visible card (one clear line, exit 2; a warning for more CPU ranks than cores) and prints the
# exports for this host: the Ascend defaults only on Ascend hosts, never overriding what the user
# exported, and torch's/torch_npu's lib folders on LD_LIBRARY_PATH.
exports="$("$PY" -m dit4dit_npu.device env --ranks "$num_processes")" || exit 2
eval "$exports"
export WANDB_MODE="${WANDB_MODE:-offline}"

[ -n "$max_train_steps" ] && overrides+=("trainer.max_train_steps=$max_train_steps")
[ -n "$per_device_batch_size" ] && overrides+=("datasets.vla_data.per_device_batch_size=$per_device_batch_size")

launch=(
  "$PY" -m accelerate.commands.launch
  --use_deepspeed --num_processes "$((num_processes * num_machines))"
  --num_machines "$num_machines" --machine_rank "$machine_rank"
  --main_process_ip "$main_process_ip" --main_process_port "$main_process_port"
  -m dit4dit_npu.train --config "$config" "${overrides[@]}"
)
if [ "$dry_run" = 1 ]; then
  printf '%s\n' "$exports"
  printf '%q ' "${launch[@]}"; echo
  exit 0
fi

LOG_DIR="${LOG_DIR:-logs}"
mkdir -p "$LOG_DIR"
LOG_FILE="$LOG_DIR/train_$(date +%Y%m%d_%H%M%S)_rank${machine_rank}.log"
echo "train_8p.sh: $num_processes process(es) x $num_machines machine(s); log: $LOG_FILE"
set -o pipefail
"${launch[@]}" 2>&1 | tee "$LOG_FILE"
