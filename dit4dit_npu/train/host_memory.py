"""A CPU host's training process, as the memory planner (``memory_plan.py --host``) plans it: its
peak resident memory, which is what ``wait4`` reports and bench/full_size_cpu.py measures, rather
than a card's allocations."""

from __future__ import annotations


def resident_bytes() -> float:
    """This process's resident memory now, after importing the training stack: a CPU training
    process's floor (the interpreter, torch, diffusers, transformers, DeepSpeed, accelerate)."""
    import deepspeed  # noqa: F401
    import diffusers  # noqa: F401

    import dit4dit_npu.train.loop  # noqa: F401

    with open("/proc/self/status") as f:
        return next(float(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def host_terms(rows: list[tuple[str, float, str]], counts: dict[str, int], trained: list[int], lora: bool,
               runtime: float) -> tuple[list[tuple[str, float, str]], float]:
    """A CPU host's training process, planned as its peak resident memory (what ``wait4`` reports
    and bench/full_size_cpu.py measures) instead of a card's allocations -> (rows, the model-load
    peak). Where a host differs from a card:
    - the process's floor: the interpreter and libraries (measured in this process);
    - DeepSpeed's gradient buckets are ``torch.empty``: only the pages gradients are written to
      become resident, at most the trained parameters' count;
    - the prompt cache lives in host memory whatever its size;
    - loading: each fp32 weight is cast from its bf16 shard, memory-mapped while the model is built,
      so the mapped file pages sit beside the fp32 copies until the load ends (a LoRA base loads in
      its files' bf16: nothing is cast)."""
    out = [("runtime (measured)", runtime, "interpreter, torch, diffusers, transformers, DeepSpeed")]
    for name, n, note in rows:
        if name.startswith("gradient bucket"):
            n, note = min(n, 4 * sum(trained)), note + "; resident: the pages written, <= the trained parameters"
        out.append((name, n, note))
    weights = runtime + sum(n for name, n, _ in out if "weights" in name or "frozen" in name)
    mapped = 0 if lora else 2 * counts["transformer"]
    return out, weights + mapped
