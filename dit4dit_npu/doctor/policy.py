"""The doctor's check of a policy folder (``--policy DIR``): the manifest's own hash and every
file's whole content hash (loading checks files over its size limit by size and edges only), and
the manifest and PolicyIO parse. No model is built."""

from __future__ import annotations

import warnings

from dit4dit_npu.doctor.results import FAIL, PASS, WARN, Result
from dit4dit_npu.errors import DiT4DiTError


def check_policy(policy_dir: str) -> Result:
    """A folder of a format without hashes is a WARN: nothing could be verified."""
    from dit4dit_npu.policy.folder import UnverifiedPolicyWarning, verify_policy

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnverifiedPolicyWarning)  # the WARN line says it
            verified, detail = verify_policy(policy_dir)
    except DiT4DiTError as e:
        return Result(FAIL, "policy", str(e))
    return Result(PASS if verified else WARN, "policy", detail)
