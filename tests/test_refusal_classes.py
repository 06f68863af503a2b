"""Every refusal the server can send is an exception of a class that docs/serving.md lists (its
"Refusals" table), with the file that defines it, and the table lists no other: the server decides
whose fault an exception is by class (``serve/server.py``: ``REFUSALS``), so the doc's list is the
whole of what a client can be told besides "internal error"."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import dit4dit_npu
from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.serve import server

DOC = Path(__file__).resolve().parents[1] / "docs" / "serving.md"
HEADING = "### Refusals: whose fault, by class"


def documented() -> dict[str, str]:
    """class name -> the file the doc says defines it."""
    text = DOC.read_text()
    assert HEADING in text
    section = re.split(r"\n##+ ", text.split(HEADING, 1)[1], maxsplit=1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| `([\w/]+\.py)` \|", section, re.M)}


def refusal_classes() -> set[type]:
    """The server's refusal classes and every subclass of them anywhere in the package."""
    for m in pkgutil.walk_packages(dit4dit_npu.__path__, "dit4dit_npu."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)

    def subclasses(c: type) -> set[type]:
        return {c, *(s for d in c.__subclasses__() for s in subclasses(d))}

    return {c for base in server.REFUSALS for c in subclasses(base) if c.__module__.startswith("dit4dit_npu")}


def test_every_refusal_class_is_listed_in_the_serving_doc_and_nothing_else_is() -> None:
    doc, classes = documented(), refusal_classes()
    assert doc, "the doc's Refusals table has no rows"
    in_code = {c.__name__: c.__module__.removeprefix("dit4dit_npu.").replace(".", "/") + ".py" for c in classes}
    assert in_code == doc  # the same classes, each defined where the doc says


def test_refusals_are_the_projects_errors_and_the_clients_are_told_apart_by_class() -> None:
    for c in refusal_classes():
        assert issubclass(c, DiT4DiTError), c
    client, policy = server.CLIENT_ERRORS, server.POLICY_REFUSALS
    assert not any(issubclass(c, client) for c in policy) and not any(issubclass(c, policy) for c in client)
    # a ValueError that is none of them is a bug deeper in the stack, not the client's mistake
    assert not isinstance(ValueError("x"), server.REFUSALS)
    assert server.refusal_text(server.RequestError("bad  key\n here")) == "bad key here"
    assert server.refusal_text(server.NonFiniteActionError("NaN")) == "NonFiniteActionError: NaN"
