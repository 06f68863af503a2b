"""Offline (open-loop) evaluation of a policy on held-out dataset episodes, with plots.

``python -m dit4dit_npu.eval --policy POLICY_DIR`` (``cli``) runs ``offline``; ``plots`` draws its PNGs.
"""
