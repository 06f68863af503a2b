"""The doctor: pre-flight checks of a host for a training run, ``python -m dit4dit_npu.doctor``.

    cli.py         the command (flags, the order of the checks, the exit code)
    stack.py       the software stack (no torch in this process: it runs where ``import torch`` fails)
    host.py        cards, a training step per card, fused attention, a real all-reduce, card memory
    run_config.py  a run config: model build, base model, data, run folder, its memory plan
    policy.py      a policy folder (--policy DIR): every file against its full content hash
    results.py     one PASS / WARN / FAIL / SKIP line per check

The probes that touch the devices are the device layer's (``device/stack.py``, ``device/probes.py``).
Importing this package (or any module of it) imports no torch.
"""
