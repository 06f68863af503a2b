"""Deployment: the websocket policy server, its robot-side client and the msgpack wire format.

``python -m dit4dit_npu.serve --policy POLICY_DIR`` (``cli``) runs ``server``, which answers each
kind of request with its handler (``handlers``); robots import
``dit4dit_npu.serve.client`` (numpy, msgpack and websockets only: no torch on the robot side).
This ``__init__`` imports nothing, so the client stays light.
"""
