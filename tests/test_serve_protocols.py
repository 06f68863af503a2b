"""The server's request formats and batching, through real websockets and the real tiny policy:
openpi's ALOHA layout and episode messages, DiT4DiT's own protocol (examples -> normalized
actions, ping), batched replies against single calls, a failing request inside a batch, and
the limits on instructions from the network."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from dit4dit_client import ServerError, msgpack_numpy
from serve_fixtures import (
    TIMEOUT,
    Dit4DitProtocolClient,
    RunningServer,
    concurrently,
    dit4dit_example,
    load_policy,
    sample_observations,
)

from dit4dit_npu.policy import DiT4DiTPolicy, ModelSpaceRequest

BATCH_WINDOW_MS = 5000.0  # long: the window closes as soon as every connected client has sent


@pytest.fixture(scope="module")
def policy() -> DiT4DiTPolicy:
    return load_policy()


@pytest.fixture(scope="module")
def observations(policy: DiT4DiTPolicy) -> list[dict[str, Any]]:
    return sample_observations(policy)


@pytest.fixture(scope="module")
def server(policy: DiT4DiTPolicy):
    with RunningServer(policy, max_batch=8, batch_window_ms=BATCH_WINDOW_MS) as s:
        yield s


def _aloha(obs: dict[str, Any], cameras: list[str], channels_first: bool) -> dict[str, Any]:
    """openpi's ALOHA layout: cameras nested under "images" by short name, CHW, "prompt"."""
    images = {k.removeprefix("observation.images."): obs[k] for k in cameras}
    if channels_first:
        images = {n: np.ascontiguousarray(np.moveaxis(img, -1, -3)) for n, img in images.items()}
    return {"images": images, "state": obs["state"], "prompt": obs["instruction"]}


def test_openpi_aloha_layout(server: RunningServer, policy: DiT4DiTPolicy, observations) -> None:
    obs = observations[2]
    expected = policy.predict_action(obs, seed=1)
    batched = {k: np.stack([obs[k], observations[3][k]]) for k in (*policy.camera_keys, "state")}
    batched["instruction"] = [obs["instruction"], observations[3]["instruction"]]
    with server.client() as client:
        for channels_first in (True, False):
            out = client.infer({**_aloha(obs, policy.camera_keys, channels_first), "seed": 1})
            np.testing.assert_array_equal(out["actions"], expected)
        both = client.infer({**_aloha(batched, policy.camera_keys, True), "seed": 1})["actions"]
        np.testing.assert_array_equal(both, policy.predict_action(batched, seed=1))
        bad = _aloha(obs, policy.camera_keys, True)
        bad["images"]["cam_top"] = bad["images"].pop("cam_high")
        with pytest.raises(ServerError, match=r"missing \['observation.images.cam_high'\]; unexpected "
                                              r"\['observation.images.cam_top'\]"):
            client.infer(bad)
        bad = _aloha(obs, policy.camera_keys, True)
        bad["images"]["cam_left_wrist"] = bad["images"]["cam_left_wrist"].astype(np.float32)
        with pytest.raises(ServerError, match="images.cam_left_wrist: expected a uint8 RGB image"):
            client.infer(bad)
        with pytest.raises(ServerError, match="is also given as a top-level key"):
            client.infer({**_aloha(obs, policy.camera_keys, True), "observation.images.cam_high": obs[
                "observation.images.cam_high"]})
        # openpi's episode bookkeeping is acknowledged as openpi's server does
        assert client.infer({"__ctrl__": "episode_start", "__experiment__": "x"}) == {"__ack__": "episode_start"}
        assert client.infer({"__ctrl__": "other"}) == {"__ack__": "ignored"}


def test_batched_replies_equal_single_calls(server: RunningServer, policy: DiT4DiTPolicy, observations) -> None:
    # Same seed, different observations (and instructions, if the data has several): one model
    # call answers all eight, and each reply is its single call's answer.
    requests = [{**obs, "seed": 7} for obs in observations]
    replies = concurrently(server, requests, rounds=2)
    sizes = {r["server_timing"]["batch_size"] for per in replies for r in per}
    assert sizes == {len(observations)}, f"expected every request in one batch of {len(observations)}, got {sizes}"
    for obs, per in zip(observations, replies):
        single = policy.predict_action(obs, seed=7)
        for r in per:
            np.testing.assert_allclose(r["actions"], single, rtol=1e-5, atol=1e-5)


def test_a_failing_request_in_a_batch_gets_its_own_error(policy: DiT4DiTPolicy, observations, caplog) -> None:
    # A state far outside anything seen (allowed by this server) passes validation but makes the
    # model output non-finite actions: the batched call is refused as a whole, each request is
    # retried alone, and only that robot gets an error.
    absurd = {**observations[0], "state": np.full(policy.state_dim, 1e30, np.float32)}
    good = [{**o, "seed": 3} for o in observations[1:4]]
    requests = [{**absurd, "seed": 3}, *good, {**observations[4], "state": observations[4]["state"][:3]}]
    # The refused request's connection stays idle, so the window runs out: keep it short here.
    with caplog.at_level(logging.WARNING, logger="dit4dit_npu.serve"), RunningServer(
        policy, max_batch=8, batch_window_ms=500, allow_out_of_range=True
    ) as server:
        replies = concurrently(server, requests)
    assert isinstance(replies[0][0], ServerError) and "NaN/inf" in str(replies[0][0])
    assert isinstance(replies[-1][0], ServerError) and "state: expected shape" in str(replies[-1][0])
    for obs, (r,) in zip(observations[1:4], replies[1:4]):  # answered alone: exactly their single calls
        np.testing.assert_array_equal(r["actions"], policy.predict_action(obs, seed=3))
        assert r["server_timing"]["batch_size"] == 1
    assert "batched call of 4 requests failed" in caplog.text  # the invalid one never joined the batch


def test_dit4dit_protocol(server: RunningServer, policy: DiT4DiTPolicy, observations) -> None:
    client = Dit4DitProtocolClient(server.uri)
    try:
        stats = client.metadata["policy_io"]["stats"]
        smin, smax = np.array(stats["state"]["min"]), np.array(stats["state"]["max"])
        amin, amax = np.array(stats["action"]["min"]), np.array(stats["action"]["max"])
        assert client.predict_action({"type": "ping", "request_id": "r1"}) == {
            "status": "ok", "ok": True, "type": "ping", "request_id": "r1"}
        examples = [dit4dit_example(o, policy.camera_keys, smin, smax) for o in observations[:2]]
        query = {"examples": examples, "do_sample": False, "use_ddim": True, "num_ddim_steps": 10, "seed": 5}
        reply = client.predict_action(query)
        assert set(reply) == {"status", "ok", "type", "request_id", "data"}
        assert (reply["status"], reply["ok"], reply["type"], reply["request_id"]) == (
            "ok", True, "inference_result", "default")
        normalized = reply["data"]["normalized_actions"]
        assert normalized.dtype == np.float32
        assert normalized.shape == (2, policy.chunk_length, policy.io.spec.action_width)
        # The client un-normalizes itself (RoboTwin's min-max inverse) and gets our robot units.
        robot = (normalized[..., : policy.action_dim] + 1) / 2 * (amax - amin) + amin
        for i, obs in enumerate(observations[:2]):
            np.testing.assert_allclose(robot[i], policy.predict_action(obs, seed=5), rtol=1e-4, atol=1e-4)
        # Errors come in the original's envelope; the connection stays open.
        wrong = {**examples[0], "image": [examples[0]["image"][0][:, :-1]]}
        err = client.predict_action({"examples": [wrong], "request_id": 9})
        assert err["status"] == "error" and not err["ok"] and err["request_id"] == 9
        assert "examples[0].image: expected a uint8 (" in err["error"]["message"]
        unknown = client.predict_action({"type": "reset"})
        assert unknown["type"] == "unknown" and "Unsupported message type 'reset'" in unknown["error"]["message"]
        assert client.predict_action({"type": "ping"})["request_id"] == "default"
        again = client.predict_action(query)["data"]["normalized_actions"]
        np.testing.assert_allclose(again, normalized, rtol=1e-5, atol=1e-5)
    finally:
        client.close()


def test_dit4dit_requests_batch_with_each_other(server: RunningServer, policy: DiT4DiTPolicy, observations) -> None:
    stats = policy.io.stats["state"]
    direct = [dit4dit_example(o, policy.camera_keys, stats.min, stats.max) for o in observations[:3]]
    clients = [Dit4DitProtocolClient(server.uri) for _ in direct]
    try:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(clients)) as pool:
            replies = list(pool.map(lambda i: clients[i].predict_action({"examples": [direct[i]], "seed": 2}),
                                    range(len(clients)), timeout=TIMEOUT))
    finally:
        for c in clients:
            c.close()
    for ex, reply in zip(direct, replies):
        alone = policy.predict_batch([ModelSpaceRequest(ex["image"][0][None], ex["state"], [ex["lang"]])], seed=2)[0]
        np.testing.assert_allclose(reply["data"]["normalized_actions"], alone, rtol=1e-5, atol=1e-5)


def test_new_instructions_are_bounded(policy: DiT4DiTPolicy, observations) -> None:
    fresh = load_policy(max_added_instructions=1)  # this test grows and shrinks its prompt cache
    trained = set(fresh.prompt_cache.instructions)
    obs = observations[0]
    with RunningServer(fresh) as srv, srv.client() as client:
        assert client.get_server_metadata()["new_instructions"] == 1
        a = client.infer({**obs, "instruction": "wave at the camera", "seed": 0})["actions"]
        client.infer({**obs, "instruction": "stack the cups"})
        assert set(fresh.prompt_cache.instructions) == trained | {"stack the cups"}  # LRU: the wave went
        calls = fresh._instructions.text_encoder.num_calls
        again = client.infer({**obs, "instruction": "wave at the camera", "seed": 0})["actions"]
        assert fresh._instructions.text_encoder.num_calls == calls + 1  # encoded again, same answer
        np.testing.assert_array_equal(again, a)
        assert set(fresh.prompt_cache.instructions) == trained | {"wave at the camera"}
    with RunningServer(fresh, refuse_new_instructions=True) as srv, srv.client() as client:
        assert client.get_server_metadata()["new_instructions"] == "refused"
        with pytest.raises(ServerError, match="'fold the towel' is not one the policy was trained with"):
            client.infer({**obs, "instruction": "fold the towel"})
        assert "fold the towel" not in fresh.prompt_cache
        assert client.infer(obs)["actions"].shape == (policy.chunk_length, policy.action_dim)
        raw_reply = None
        with srv.raw() as ws:
            ws.send(msgpack_numpy.packb({"examples": [{"image": [np.zeros((*policy.io.frame_size, 3), np.uint8)],
                                                       "lang": "fold the towel",
                                                       "state": np.zeros(policy.io.spec.state_width)}]}))
            raw_reply = msgpack_numpy.unpackb(ws.recv(timeout=TIMEOUT))
        assert raw_reply["status"] == "error" and "refuses new instructions" in raw_reply["error"]["message"]


def test_live_images_are_resized_the_policys_way(observations) -> None:
    # The server validates (and resizes) each request before batching it, with the same parsing
    # as the policy's own: an imported DiT4DiT policy resizes with torch bilinear, not swscale.
    fresh = load_policy()
    fresh.io.resize.method = "torch_bilinear"
    cams, (h, w) = fresh.camera_keys, fresh.image_size
    rng = np.random.default_rng(0)
    big = {**observations[0], **{k: rng.integers(0, 256, (2 * h, 2 * w, 3), dtype=np.uint8) for k in cams}}
    expected = fresh.predict_action(big, seed=0)
    with RunningServer(fresh) as srv, srv.client() as client:
        np.testing.assert_array_equal(client.infer({**big, "seed": 0})["actions"], expected)
        np.testing.assert_array_equal(client.infer({**_aloha(big, cams, True), "seed": 0})["actions"], expected)
    fresh.io.resize.method = "swscale"
    assert not np.allclose(fresh.predict_action(big, seed=0), expected, atol=1e-4)  # the method matters
