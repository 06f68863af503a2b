"""Deployment: the websocket policy server, its robot-side client and the msgpack wire format.

``python -m dit4dit_npu.serve --policy POLICY_DIR`` runs ``server``; robots import
``dit4dit_npu.serve.client`` (numpy, msgpack and websockets only: no torch on the robot side).
This ``__init__`` imports nothing, so the client stays light.
"""
