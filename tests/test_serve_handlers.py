"""The server's request handlers: each kind dispatched to its own handler, an observation parsed
once on its way to the model (a real PolicyIO subclass counts), non-finite actions refused in
each kind's own format, unknown message shapes answered in one line on a connection that stays
usable, requests over the row or decoded-size caps and states far outside the training range
refused before any work. Real websockets, the real tiny policy."""

from __future__ import annotations

import threading
from typing import Any

import msgpack
import numpy as np
import pytest
from dit4dit_client import ServerError, msgpack_numpy
from serve_fixtures import (
    TIMEOUT,
    Dit4DitProtocolClient,
    RunningServer,
    concurrently,
    load_policy,
    sample_observations,
)

from dit4dit_npu.batch import Batch
from dit4dit_npu.policy import DiT4DiTPolicy, StateOutOfRangeError, StateRangeWarning
from dit4dit_npu.serve import protocol
from dit4dit_npu.serve.handlers import Handlers, InstructionGate
from dit4dit_npu.transforms.observation import Observation
from dit4dit_npu.transforms.policy_io import PolicyIO


class CountingIO(PolicyIO):
    """The policy's own PolicyIO, counting how often an observation is parsed and encoded."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.parsed = self.encoded = 0
        self._count_lock = threading.Lock()  # parsing runs on the event loop and helper threads

    def parse_observation(self, obs: Any) -> Observation:
        with self._count_lock:
            self.parsed += 1
        return super().parse_observation(obs)

    def encode_parsed(self, o: Observation) -> Batch:
        with self._count_lock:
            self.encoded += 1
        return super().encode_parsed(o)

    def reset(self) -> None:
        self.parsed = self.encoded = 0


@pytest.fixture(scope="module")
def policy() -> DiT4DiTPolicy:
    return load_policy()


def counting_policy() -> tuple[DiT4DiTPolicy, CountingIO]:
    """A fresh policy built around a counting copy of its PolicyIO (given at construction)."""
    loaded = load_policy()
    io = CountingIO.from_dict(loaded.io.to_dict())
    return DiT4DiTPolicy(loaded.model, loaded.manifest, io, loaded.prompt_cache, loaded.path), io


@pytest.fixture(scope="module")
def observations(policy: DiT4DiTPolicy) -> list[dict[str, Any]]:
    return sample_observations(policy, 4)


def _example(policy: DiT4DiTPolicy, lang: str, state: float = 0.0) -> dict[str, Any]:
    return {"image": [np.zeros((*policy.io.frame_size, 3), np.uint8)], "lang": lang,
            "state": np.full((1, policy.io.spec.state_width), state, np.float32)}


def test_each_message_kind_has_its_handler(policy: DiT4DiTPolicy, observations) -> None:
    handlers = Handlers.for_policy(policy, InstructionGate())
    obs = observations[0]
    openpi = {"images": {k.removeprefix("observation.images."): obs[k] for k in policy.camera_keys},
              "state": obs["state"], "prompt": obs["instruction"]}
    kinds = {
        "openpi_control": [{"__ctrl__": "episode_start"}, {"__ctrl__": "x", "examples": []}],
        "dit4dit_ping": [{"type": "ping"}, {"type": "ping", "request_id": 3}],
        "dit4dit_infer": [{"examples": []}, {"type": "infer"}, {"type": "reset"}, {"type": ["ping"]}],
        "observation": [obs, openpi, {"anything": 1}, {}],
    }
    for name, messages in kinds.items():
        for msg in messages:
            assert handlers.find(msg).name == name, msg
    for not_a_dict in ([1, 2], 3, "observation", None, b"x"):
        with pytest.raises(protocol.RequestError, match="expected an observation dict, got "):
            handlers.find(not_a_dict)
    # Without the catch-all observation handler, an unclaimed dict says what the server answers.
    only_dit4dit = Handlers([h for h in handlers if h.name.startswith("dit4dit")])
    with pytest.raises(protocol.RequestError, match=r"no request kind has the keys \['x'\]; this server answers"):
        only_dit4dit.find({"x": 1})
    with pytest.raises(ValueError, match="unique"):
        Handlers([*handlers, *handlers])


def test_every_kind_on_one_connection_and_unknown_shapes_get_one_line(policy: DiT4DiTPolicy, observations) -> None:
    obs = observations[0]
    expected = policy.predict_action(obs, seed=2)
    unknown_shapes = [msgpack.packb([1, 2, 3]), msgpack.packb(7), msgpack.packb("hello"), msgpack.packb(None)]
    with RunningServer(policy) as srv, srv.raw() as ws:
        def ask(msg: Any) -> Any:
            ws.send(msg if isinstance(msg, bytes) else msgpack_numpy.packb(msg))
            reply = ws.recv(timeout=TIMEOUT)
            return reply if isinstance(reply, str) else msgpack_numpy.unpackb(reply)

        for raw in unknown_shapes:
            reply = ask(raw)
            assert isinstance(reply, str) and reply.startswith("expected an observation dict, got ") and "\n" not in reply
        assert ask({"__ctrl__": "episode_end"}) == {"__ack__": "episode_end"}
        assert ask({"type": "ping", "request_id": 4}) == {"status": "ok", "ok": True, "type": "ping", "request_id": 4}
        ping_typo = ask({"type": "ping", "request_idx": 4})  # refused in DiT4DiT's envelope, not a text frame
        assert ping_typo["status"] == "error" and "unknown request key(s) ['request_idx']" in ping_typo["error"]["message"]
        reply = ask({"examples": [_example(policy, obs["instruction"])], "seed": 1, "request_id": "a"})
        assert reply["request_id"] == "a" and reply["data"]["normalized_actions"].shape[0] == 1
        np.testing.assert_array_equal(ask({**obs, "seed": 2})["actions"], expected)
        assert "missing" in ask({"anything": 1})  # a dict nobody else claims is read as an observation
        np.testing.assert_array_equal(ask({**obs, "seed": 2})["actions"], expected)  # still serving


def test_an_observation_is_parsed_once_on_its_way_to_the_model(observations) -> None:
    fresh, io = counting_policy()
    cams, (h, w) = fresh.camera_keys, fresh.image_size
    rng = np.random.default_rng(0)
    # Camera-size images: resized on arrival (on a helper thread, being large), never again.
    big = {**observations[0], **{k: rng.integers(0, 256, (24 * h, 24 * w, 3), dtype=np.uint8) for k in cams}}
    expected = fresh.predict_action(big, seed=0)
    assert (io.parsed, io.encoded) == (1, 1)
    with RunningServer(fresh, max_batch=8, batch_window_ms=5000) as srv:
        io.reset()
        with srv.client() as client:
            np.testing.assert_array_equal(client.infer({**big, "seed": 0})["actions"], expected)
        assert (io.parsed, io.encoded) == (1, 1)
        # Three robots at once: each request parsed once, on arrival; one model call for all three.
        io.reset()
        replies = concurrently(srv, [{**o, "seed": 5} for o in observations[1:4]])
        assert {r["server_timing"]["batch_size"] for (r,) in replies} == {3}
        assert (io.parsed, io.encoded) == (3, 1)


def test_non_finite_actions_are_refused_in_each_kinds_format(policy: DiT4DiTPolicy, observations) -> None:
    # One owner of the check (the policy), whatever the kind: robot units and normalized alike.
    obs = observations[0]
    absurd = {**obs, "state": np.full(policy.state_dim, 1e30)}
    with RunningServer(policy, allow_out_of_range=True) as srv:
        with srv.raw() as ws:
            ws.send(msgpack_numpy.packb(absurd))
            reply = ws.recv(timeout=TIMEOUT)
            assert isinstance(reply, str) and reply.startswith("NonFiniteActionError: predict_action produced ") and "\n" not in reply
        client = Dit4DitProtocolClient(srv.uri)
        try:
            err = client.predict_action({"examples": [_example(policy, obs["instruction"], 1e30)], "request_id": 8})
            assert (err["status"], err["ok"], err["type"], err["request_id"]) == ("error", False, "inference_result", 8)
            assert err["error"]["message"].startswith("NonFiniteActionError: predict_batch (model space) produced ")
            ok = client.predict_action({"examples": [_example(policy, obs["instruction"])]})
            assert ok["status"] == "ok" and np.isfinite(ok["data"]["normalized_actions"]).all()
        finally:
            client.close()


# -- a server that cannot be flooded, states that are not plausible --------------------------------


def _flood(policy: DiT4DiTPolicy, obs: dict[str, Any], rows: int) -> dict[str, Any]:
    """The issue's request: ``rows`` tiny images per camera (92 KB at 1024 rows), each to be
    upscaled to the training size."""
    return {**{k: np.zeros((rows, 2, 2, 3), np.uint8) for k in policy.camera_keys},
            "state": np.repeat(obs["state"][None], rows, 0), "instruction": obs["instruction"]}


def test_rows_and_decoded_size_of_a_request_are_capped_before_any_work(observations) -> None:
    fresh, io = counting_policy()
    obs = observations[0]
    h, w = fresh.image_size
    cams = len(fresh.camera_keys)
    with RunningServer(fresh, max_batch=8) as srv, srv.raw() as ws:
        def ask(msg: dict[str, Any]) -> Any:
            ws.send(msgpack_numpy.packb(msg))
            reply = ws.recv(timeout=TIMEOUT)
            return reply if isinstance(reply, str) else msgpack_numpy.unpackb(reply)

        io.reset()
        assert ask(_flood(fresh, obs, 1024)) == (
            "request has 1024 rows; this server answers at most 8 per request (--max-rows): split it into requests "
            "of at most 8"
        )
        many = [_example(fresh, obs["instruction"])] * 9  # DiT4DiT's examples count as rows too
        assert ask({"examples": many})["error"]["message"].startswith("request has 9 rows; this server answers at most 8")
        assert io.parsed == 0  # refused from the shapes alone: nothing decoded or resized
        assert ask({**obs, "seed": 1})["actions"].shape == (fresh.chunk_length, fresh.action_dim)  # still usable
        assert ask(_flood(fresh, obs, 8))["actions"].shape == (8, fresh.chunk_length, fresh.action_dim)
    # Rows raised by the operator: the decoded size still bounds the request's memory.
    limit = 2**20
    with RunningServer(fresh, max_rows=1024, max_decoded_bytes=limit) as srv, srv.client() as client:
        io.reset()
        size = 1024 * cams * (2 * 2 * 3 + h * w * 3)
        with pytest.raises(ServerError) as e:
            client.infer(_flood(fresh, obs, 1024))
        assert str(e.value) == (
            f"request would take {size / 2**20:.1f} MiB once decoded and resized to {h}x{w} (1024 row(s) x {cams} "
            "camera(s)), over this server's limit of 1.0 MiB (--max-decoded-mb); send fewer rows per request"
        )
        assert io.parsed == 0
        assert client.infer(obs)["actions"].shape == (fresh.chunk_length, fresh.action_dim)
        meta = client.get_server_metadata()
        assert meta["request_limits"] == {"max_rows": 1024, "max_decoded_bytes": limit}


def test_a_state_far_outside_the_training_range_is_refused_or_answered_with_a_warning(
    policy: DiT4DiTPolicy, observations
) -> None:
    obs = observations[0]
    degrees = {**obs, "state": np.degrees(obs["state"])}
    with pytest.raises(StateOutOfRangeError) as refused:
        policy.parse(degrees)
    expected = refused.value.problem
    with RunningServer(policy) as srv, srv.client() as client:
        with pytest.raises(ServerError) as e:
            client.infer({**degrees, "seed": 0})
        assert str(e.value) == (f"{expected}; refused (a server started with --allow-out-of-range answers it, "
                                "with this warning in the reply)")
        assert "warnings" not in client.infer(obs) and client.get_server_metadata()["out_of_range_state"] == "refused"
    with RunningServer(policy, allow_out_of_range=True) as srv, srv.client() as client:
        with pytest.warns(StateRangeWarning):
            want = policy.predict_action(degrees, seed=0, allow_out_of_range=True)
        reply = client.infer({**degrees, "seed": 0})
        assert reply["warnings"] == [expected]
        np.testing.assert_array_equal(reply["actions"], want)
        assert "warnings" not in client.infer(obs)


def test_one_flag_allows_out_of_range_inputs_and_its_former_spelling_says_so(capsys) -> None:
    from dit4dit_npu.serve.cli import parse_args

    assert parse_args(["--policy", "p"]).allow_out_of_range is False
    assert parse_args(["--policy", "p", "--allow-out-of-range"]).allow_out_of_range is True
    assert capsys.readouterr().err == ""
    assert parse_args(["--policy", "p", "--allow-out-of-range-state"]).allow_out_of_range is True
    assert capsys.readouterr().err == "notice: --allow-out-of-range-state is deprecated, use --allow-out-of-range\n"


class InterfaceOnly:
    """The policy's server interface and nothing else (no ``io``, no ``metadata``): a server that
    reached past it would fail here."""

    def __init__(self, policy: DiT4DiTPolicy) -> None:
        self._p = policy
        self.parse, self.with_rtc, self.predict_batch = policy.parse, policy.with_rtc, policy.predict_batch
        self.describe = policy.describe

    @property
    def max_added_instructions(self) -> int | None:  # read-only: a server that set it would fail here
        return self._p.max_added_instructions


def test_the_server_needs_only_the_policys_small_interface(policy, observations) -> None:
    from serve_fixtures import dit4dit_example

    obs = observations[0]
    with RunningServer(InterfaceOnly(policy)) as srv, srv.client() as client:
        meta = client.get_server_metadata()
        assert (meta["camera_keys"], meta["chunk_length"], meta["action_shape"]) == (
            policy.camera_keys, policy.chunk_length, [policy.chunk_length, policy.action_dim])
        out = client.infer({**obs, "seed": 3})
        np.testing.assert_array_equal(out["actions"], policy.predict_action(obs, seed=3))
        again = client.infer({**obs, "seed": 4}, rtc={"executed": 2, "inference_delay": 1})
        assert again["actions"].shape == (policy.chunk_length, policy.action_dim)
        stats = meta["policy_io"]["stats"]["state"]
        d4d = Dit4DitProtocolClient(srv.uri)
        try:
            example = dit4dit_example(obs, policy.camera_keys, np.array(stats["min"]), np.array(stats["max"]))
            reply = d4d.predict_action({"examples": [example], "seed": 5})
            assert reply["data"]["normalized_actions"].shape == (1, policy.chunk_length, policy.describe().action_width)
        finally:
            d4d.close()


class FailingPredictions(InterfaceOnly):
    """The real policy's interface whose predictions fail with a plain ValueError, as a bug deeper
    in the stack would raise it (a shape mismatch in a model, say)."""

    def __init__(self, policy: DiT4DiTPolicy) -> None:
        super().__init__(policy)
        self.predict_batch = self._fail

    @staticmethod
    def _fail(requests: Any, seed: Any = None) -> Any:
        raise ValueError("operands could not be broadcast together")


def test_whose_fault_is_decided_by_class_not_by_valueerror(policy, observations) -> None:
    """A ValueError that is no refusal class of the server's (docs/serving.md) is the server's
    fault: "internal error: ..." (it was answered as if the client had sent bad input); the
    client's own errors still come back as their line."""
    obs = observations[0]
    with RunningServer(FailingPredictions(policy)) as srv, srv.raw() as ws:
        ws.send(msgpack_numpy.packb({**obs, "seed": 1}))
        assert ws.recv(timeout=TIMEOUT) == "internal error: ValueError: operands could not be broadcast together"
        ws.send(msgpack_numpy.packb({**obs, "seed": 1.5}))
        assert ws.recv(timeout=TIMEOUT) == "seed: expected an int in [0, 2**63), got float 1.5"
        ws.send(b"\xc1\x00garbage")  # the client package's WireFormatError: the client's fault
        assert ws.recv(timeout=TIMEOUT).startswith("malformed msgpack message")
