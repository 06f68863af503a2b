"""The robot loop's own arguments (client/dit4dit_client: runtime.py, chunking.py, checks.py): a control
rate outside the policy server's bounds, (0, 1000], and a step count that is not an int (a bool
neither) are refused where they are given, in one line naming the argument (``ArgumentError``, a
``ClientError`` that is also a ``ValueError`` and a ``TypeError``, the builtins callers caught).
The client's bound and the server's agree: every rate is refused by both or by neither."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from dit4dit_client import AsyncChunkRunner, ChunkExecutor, ClientError, delay_steps
from dit4dit_client.checks import MAX_CONTROL_HZ, check_control_hz
from dit4dit_client.errors import ArgumentError

RATES = [1000, 1000.0, 1000.5, 5000, 1e9, math.inf, -math.inf, math.nan, 0, 0.0, -1, 1e-9, 50, 50.0,
         np.float32(200), np.int64(30), np.float64(60), True, "50"]  # (None: the server reads it as not given)


def runner(control_hz, sent: list | None = None) -> AsyncChunkRunner:
    sent = [] if sent is None else sent
    return AsyncChunkRunner(lambda obs, req: np.zeros((8, 2)), ChunkExecutor("async", 4), control_hz,
                            get_observation=dict, send_action=sent.append)


@pytest.mark.parametrize("hz", [math.inf, 1e9, 5000, 1000.5, 0, -1, math.nan])
def test_a_control_rate_outside_the_servers_bounds_is_refused(hz) -> None:
    with pytest.raises(ArgumentError) as e:
        runner(hz)
    msg = str(e.value)
    assert msg.startswith("AsyncChunkRunner: control_hz: expected the robot's control rate in Hz, > 0 and at most 1000")
    assert "\n" not in msg and isinstance(e.value, ValueError) and isinstance(e.value, ClientError)
    with pytest.raises(ArgumentError, match="^control_hz: expected"):
        delay_steps(0.1, hz)


@pytest.mark.parametrize(("hz", "got"), [  # (numpy 2 writes np.float32(50.0), numpy 1 50.0)
    (np.float32(50), r"float32 (np\.float32\()?50\.0\)?"), (True, "bool True"), ("50", "str '50'")])
def test_a_control_rate_of_another_type_is_refused_naming_the_type(hz, got) -> None:
    """The server takes a Python int or float only (numpy's float32 too is refused there); the
    message said the 0-1000 bounds, which 50 is within."""
    with pytest.raises(ArgumentError) as e:
        runner(hz)
    assert re.fullmatch(re.escape("AsyncChunkRunner: control_hz: expected the robot's control rate in Hz as a Python "
                                  "int or float (the policy server takes no other type; float(x) converts numpy's), got ")
                        + got, str(e.value)), str(e.value)
    assert runner(float(hz)).control_hz == float(hz)


@pytest.mark.parametrize(("name", "value", "got"), [
    ("executor", "async", "expected a ChunkExecutor, got str"),
    ("infer", None, "expected a callable, got NoneType None"),
    ("get_observation", {}, "expected a callable, got dict {}"),
    ("send_action", [], "expected a callable, got list []"),
    ("clock", 0.0, "expected a callable, got float 0.0"),
    ("sleep", 1, "expected a callable, got int 1"),
])
def test_the_runner_checks_its_executor_and_functions_where_they_are_given(name, value, got) -> None:
    """They were used only in run(): an AttributeError or 'object is not callable' from deep inside
    the loop (a send_action of the wrong kind after the first request had gone out)."""
    args = {"infer": lambda obs, req: np.zeros((8, 2)), "executor": ChunkExecutor("async", 4), "control_hz": 50,
            "get_observation": dict, "send_action": [].append, name: value}
    with pytest.raises(ArgumentError) as e:
        AsyncChunkRunner(**args)
    assert str(e.value) == f"AsyncChunkRunner: {name}: {got}"


def test_a_very_slow_rate_is_taken_and_its_first_tick_waits_out_the_period() -> None:
    """The bound is the server's, > 0 only: 1e-300 Hz is accepted, and the first tick's wait of
    1e300 s is slept in pieces time.sleep takes (one sleep of it raised OverflowError)."""
    slept: list[float] = []

    class Waited(Exception):
        pass

    def sleep(s: float) -> None:
        slept.append(s)
        if len(slept) == 3:
            raise Waited

    r = AsyncChunkRunner(lambda obs, req: np.zeros((8, 2)), ChunkExecutor("async", 4), 1e-300, get_observation=dict,
                         send_action=[].append, sleep=sleep)
    with pytest.raises(Waited):
        r.run(2)
    assert r.period > 1e299 and len(slept) == 3 and all(0 < s <= 86400 for s in slept)


def test_rates_within_the_bounds_run() -> None:
    sent: list = []
    stats = runner(1000, sent).run(5)  # the upper bound itself: 5 ms
    assert stats.steps == 5 and len(sent) + stats.idle == 5
    assert runner(np.float64(200)).control_hz == 200.0 and delay_steps(0.1, 50) == 5


@pytest.mark.parametrize("steps", [2.5, True, np.float64(3), "3", None, -1])
def test_run_takes_an_int_step_count(steps) -> None:
    sent: list = []
    r = runner(50, sent)
    with pytest.raises(ArgumentError, match=r"^AsyncChunkRunner.run: steps: expected (an int )?>= 0") as e:
        r.run(steps)
    assert isinstance(e.value, TypeError) and isinstance(e.value, ValueError)  # either except clause still works
    assert sent == []  # nothing reached the robot
    assert r.run(np.int64(0)).steps == 0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"execution_horizon": 2.5}, r"execution_horizon: expected an int >= 1 \(or None: whole chunks\), got float 2.5"),
    ({"execution_horizon": True}, r"execution_horizon: expected an int >= 1 .*got bool True"),
    ({"execution_horizon": 0}, r"execution_horizon: expected >= 1 \(or None: whole chunks\), got 0"),
    ({"initial_delay": 1.5}, r"initial_delay: expected an int >= 0, got float 1.5"),
    ({"initial_delay": -1}, r"initial_delay: expected >= 0, got -1"),
    ({"delay_window": False}, r"delay_window: expected an int >= 1, got bool False"),
    ({"ensemble_decay": math.nan}, r"ensemble_decay: expected a finite number >= 0"),
    ({"ensemble_decay": math.inf}, r"ensemble_decay: expected a finite number >= 0"),
])
def test_the_executor_refuses_non_integer_step_counts(kwargs, message) -> None:
    with pytest.raises(ArgumentError, match=f"^{message}"):
        ChunkExecutor("rtc", **kwargs)


def test_the_executor_refuses_a_non_integer_step() -> None:
    ex = ChunkExecutor("async", np.int64(4))
    assert ex.execution_horizon == 4 and type(ex.execution_horizon) is int
    for call in (ex.wants_request, ex.request, ex.action):
        with pytest.raises(ArgumentError, match="^step: expected an int >= 0, got float 1.5"):
            call(1.5)
    ex.request(0)
    with pytest.raises(ArgumentError, match="^step: expected an int >= 0, got bool True"):
        ex.receive(np.zeros((8, 2)), True)
    ex.receive(np.zeros((8, 2)), 1)
    assert ex.action(np.int64(2)) is not None


def test_the_client_and_the_server_take_the_same_control_rates() -> None:
    """One bound on each side of the wire (the client installs without the server, which checks a
    request's rtc.control_hz in dit4dit_npu.policy.rtc): they must agree, value by value, at the
    edges too."""
    from dit4dit_npu.policy.rtc import MAX_CONTROL_HZ as SERVER_MAX
    from dit4dit_npu.policy.rtc import parse_rtc
    from dit4dit_npu.transforms.observation import PolicyInputError

    assert MAX_CONTROL_HZ == SERVER_MAX
    for hz in RATES:
        try:
            check_control_hz(hz)
            client_ok = True
        except ArgumentError:
            client_ok = False
        try:  # the server's check of a request's rtc.control_hz
            parse_rtc({"control_hz": hz, "prev_chunk": np.zeros((8, 2))})
            server_ok = True
        except PolicyInputError:
            server_ok = False
        assert client_ok == server_ok, hz
