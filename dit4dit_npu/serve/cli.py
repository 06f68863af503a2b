"""``python -m dit4dit_npu.serve --policy DIR [--host 127.0.0.1 --port 8000]`` (``dit4dit-serve``):
the command line of the policy server (``server.py``). Checks the port before the (minutes-long at
full size) model load, loads the policy, serves until interrupted; every user error is one line
and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import time

from dit4dit_npu.console import add_compile_flag, entry_point, former_names, require
from dit4dit_npu.serve.server import (
    DEFAULT_BATCH_WINDOW_MS,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_NEW_INSTRUCTIONS,
    PolicyServer,
    check_port,
)

logger = logging.getLogger("dit4dit_npu.serve")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m dit4dit_npu.serve",
        description="Serve an exported DiT4DiT policy over websocket + msgpack (openpi wire format; "
        "DiT4DiT's own {'examples': [...]} requests too).",
    )
    policy = p.add_argument("--policy", help="exported policy folder (contains policy.json; required)")
    former_names(p, policy, "--checkpoint")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0 = any free port)")
    p.add_argument("--base-model", default=None, help="override the base model path recorded at export")
    p.add_argument("--bf16", action="store_true", help="cast the video backbone to bf16 (accelerators)")
    p.add_argument("--merge-lora", action="store_true", help="fold a LoRA policy's adapter into the base transformer at load (no adapter cost per step)")
    add_compile_flag(p)
    p.add_argument("--max-message-mb", type=float, default=DEFAULT_MAX_MESSAGE_BYTES / 2**20,
                   help="largest request answered, in MiB (default: %(default)g); bigger ones get an error")
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                   help="most observation rows answered by one model call (default: %(default)d; "
                   "1 = one request at a time)")
    p.add_argument("--max-rows", type=int, default=None,
                   help="most observation rows (or DiT4DiT examples) in one request (default: --max-batch)")
    p.add_argument("--max-decoded-mb", type=float, default=None,
                   help="most MiB a request's images may take once decoded and resized to the model size, checked "
                   "before decoding (default: twice --max-message-mb)")
    allow = p.add_argument("--allow-out-of-range", action="store_true",
                           help="answer states and rtc prev_chunks far outside the training range (refused by "
                           "default) with a warning in the reply's 'warnings'")
    former_names(p, allow, "--allow-out-of-range-state")
    p.add_argument("--batch-window-ms", type=float, default=DEFAULT_BATCH_WINDOW_MS,
                   help="how long the first request of a batch waits for others to join (default: %(default)g)")
    p.add_argument("--max-new-instructions", type=int, default=None,
                   help="instructions outside the training set kept encoded, least recently used dropped "
                   f"(default: {DEFAULT_MAX_NEW_INSTRUCTIONS}; each is ~100 MB at full size)")
    p.add_argument("--refuse-new-instructions", action="store_true",
                   help="answer only the instructions the policy was trained with")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING or ERROR")
    args = p.parse_args(argv)
    require(p, args, policy)
    for name, low in (("max_batch", 1), ("max_new_instructions", 0)):
        if getattr(args, name) is not None and getattr(args, name) < low:
            p.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    # a NaN passes every comparison, and an inf overflows the byte counts after the model load
    for name in ("batch_window_ms", "max_message_mb", "max_decoded_mb"):
        if (v := getattr(args, name)) is not None and not math.isfinite(v):
            p.error(f"--{name.replace('_', '-')} must be a finite number, got {v}")
    if args.batch_window_ms < 0 or args.max_message_mb <= 0:
        p.error("--batch-window-ms must be >= 0 and --max-message-mb > 0")
    if args.refuse_new_instructions and args.max_new_instructions is not None:
        p.error(f"--max-new-instructions {args.max_new_instructions} with --refuse-new-instructions: the cap "
                "has no effect when every new instruction is refused (give one of them)")
    if args.max_new_instructions is None:
        args.max_new_instructions = DEFAULT_MAX_NEW_INSTRUCTIONS
    if args.max_rows is not None and args.max_rows < 1:
        p.error(f"--max-rows must be >= 1, got {args.max_rows}")
    if args.max_decoded_mb is not None and not args.max_decoded_mb > 0:
        p.error(f"--max-decoded-mb must be > 0, got {args.max_decoded_mb}")
    if not 0 <= args.port <= 65535:  # else bind() raises OverflowError after the argument checks
        p.error(f"--port must be in 0..65535, got {args.port}")
    if args.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        p.error(f"--log-level must be DEBUG, INFO, WARNING or ERROR, got {args.log_level!r}")
    return args


@entry_point
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    check_port(args.host, args.port)  # before the (minutes-long at full size) model load
    import torch  # only once we need it

    from dit4dit_npu.policy import DiT4DiTPolicy

    t0 = time.perf_counter()
    policy = DiT4DiTPolicy.from_pretrained(
        args.policy, base_model=args.base_model, backbone_dtype=torch.bfloat16 if args.bf16 else None,
        merge_lora=args.merge_lora, compile=args.compile,
        # the server's limit, given to the policy that holds it (nothing added when all are refused)
        max_added_instructions=0 if args.refuse_new_instructions else args.max_new_instructions,
    )
    logger.info("policy loaded in %.1f s", time.perf_counter() - t0)
    server = PolicyServer(
        policy, args.host, args.port, max_message_bytes=int(args.max_message_mb * 2**20),
        max_batch=args.max_batch, batch_window_ms=args.batch_window_ms,
        refuse_new_instructions=args.refuse_new_instructions,
        max_rows=args.max_rows,
        max_decoded_bytes=None if args.max_decoded_mb is None else int(args.max_decoded_mb * 2**20),
        allow_out_of_range=args.allow_out_of_range,
    )
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("binding %s: the server has no authentication; expose it on trusted networks only",
                       args.host)
    asyncio.run(server.serve_forever())  # a port taken while the model loaded: ServeError, one line
    return 0
