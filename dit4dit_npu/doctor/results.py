"""What every doctor check returns: one ``Result`` line, PASS / WARN / FAIL / SKIP."""

from __future__ import annotations

import dataclasses

from dit4dit_npu.device.probes import FAIL, PASS, SKIP, WARN

__all__ = ["FAIL", "PASS", "SKIP", "WARN", "Result"]


@dataclasses.dataclass(frozen=True)
class Result:
    status: str
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status} {self.name}: {' '.join(self.detail.split())}"
