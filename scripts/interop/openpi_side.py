"""The openpi side of ``scripts/interop_check.sh`` (runs in the side virtualenv with openpi-client).

    python openpi_side.py HOST PORT OBS.npz

An unchanged openpi ``WebsocketClientPolicy`` wrapped in its ``ActionChunkBroker`` talks to our
server (``python -m dit4dit_npu.serve``). ``OBS.npz`` (from ``ours.py observations``) holds robot
observations and the actions this project's policy predicts for them with seed 0, so the actions
that come over the wire are compared exactly. Every line printed is ``PASS ...`` or ``FAIL ...``;
the exit code is the number of FAILs. Nothing here imports dit4dit_npu.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from openpi_client.action_chunk_broker import ActionChunkBroker
from openpi_client.websocket_client_policy import WebsocketClientPolicy


def load(npz: Path) -> tuple[list[dict], list[np.ndarray], dict]:
    data, meta = np.load(npz), json.loads(npz.with_suffix(".json").read_text())
    obs, actions = [], []
    for n in range(meta["count"]):
        prefix = f"{n}/obs/"
        o = {k[len(prefix) :]: data[k] for k in data.files if k.startswith(prefix)}
        o["prompt"] = str(o["prompt"])
        obs.append(o | {"seed": 0})
        actions.append(data[f"{n}/actions"])
    return obs, actions, meta


def chunk_through_broker(broker: ActionChunkBroker, obs: dict, horizon: int) -> np.ndarray:
    """One action per ``infer`` call, as a robot loop gets them; the broker asks the server once."""
    steps = []
    for _ in range(horizon):
        reply = broker.infer(obs)
        if "actions" not in reply:
            raise RuntimeError(f"reply without actions: {str(reply)[:200]}")
        steps.append(np.asarray(reply["actions"]))
    return np.stack(steps)


def check_actions(client: WebsocketClientPolicy, obs: list[dict], want: list[np.ndarray], meta: dict) -> int:
    horizon = meta["chunk_length"]
    broker = ActionChunkBroker(client, action_horizon=horizon)
    got = [chunk_through_broker(broker, o, horizon) for o in obs]
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g.shape != w.shape or not np.array_equal(g, w)]
    if bad:
        i = bad[0]
        print(f"FAIL openpi WebsocketClientPolicy + ActionChunkBroker: actions of observation {i} differ from the policy's: {got[i].shape} vs {want[i].shape}")
        return 1
    server = client.get_server_metadata()
    print(
        f"PASS openpi WebsocketClientPolicy + ActionChunkBroker: {len(obs)} observations x {horizon} steps, actions "
        f"{got[0].shape[1:]} each, equal to the policy's own predict_action (server metadata: camera_keys "
        f"{server.get('camera_keys')}, chunk_length {server.get('chunk_length')})"
    )
    return 0


def check_bad_observation(client: WebsocketClientPolicy, obs: dict, want: np.ndarray, meta: dict) -> int:
    """openpi's server sends errors as a text frame, on which openpi's client raises: ours must too,
    and keep the connection open for the next request."""
    broker = ActionChunkBroker(client, action_horizon=meta["chunk_length"])
    bad = {k: v for k, v in obs.items() if k != "state"}
    try:
        reply = broker.infer(bad)
    except Exception as e:  # openpi raises RuntimeError("Error in inference server:\n<message>")
        message = str(e).strip().splitlines()[-1]
        after = chunk_through_broker(ActionChunkBroker(client, meta["chunk_length"]), obs, meta["chunk_length"])
        if not np.array_equal(after, want):
            print("FAIL openpi client raises on a bad observation, but the next good observation got other actions")
            return 1
        print(f"PASS openpi client raises on a bad observation (no state): {type(e).__name__}: {message!r}; the connection stays open")
        return 0
    print(
        f"FAIL openpi client raises on a bad observation (no state): it returned {str(reply)[:160]} instead "
        "(errors must be sent as openpi's server does: a text frame)"
    )
    return 1


def check_aloha_layout(client: WebsocketClientPolicy, obs: dict, want: np.ndarray, meta: dict) -> int:
    """openpi's ALOHA observation: {"images": {"cam_high": CHW uint8, ...}, "state", "prompt"}."""
    images = {k.split(".")[-1]: np.ascontiguousarray(obs[k].transpose(2, 0, 1)) for k in meta["camera_keys"]}
    aloha = {"images": images, "state": obs["state"], "prompt": obs["prompt"], "seed": 0}
    try:
        got = chunk_through_broker(ActionChunkBroker(client, meta["chunk_length"]), aloha, meta["chunk_length"])
    except Exception as e:
        print(f"FAIL openpi ALOHA observation layout (images/cam_high CHW, state, prompt): {type(e).__name__}: {str(e).strip().splitlines()[-1]}")
        return 1
    if not np.array_equal(got, want):
        print("FAIL openpi ALOHA observation layout: accepted, but the actions differ from the flat layout's")
        return 1
    print(f"PASS openpi ALOHA observation layout (images/{'|'.join(images)} CHW, state, prompt): same actions as the flat layout")
    return 0


def main(host: str, port: int, npz: Path) -> int:
    obs, want, meta = load(npz)
    client = WebsocketClientPolicy(host, port)
    fails = check_actions(client, obs, want, meta)
    fails += check_bad_observation(client, obs[0], want[0], meta)
    return fails + check_aloha_layout(client, obs[0], want[0], meta)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])))
