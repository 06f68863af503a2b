"""Deployment: the websocket policy server.

``python -m dit4dit_npu.serve --policy POLICY_DIR`` (``cli``) runs ``server``, which answers each
kind of request with its handler (``handlers``), keeping per-connection sessions (``session``) for
real-time chunking. The robot side and the msgpack wire format are their own package,
``dit4dit_client`` (``client/``: numpy, msgpack and websockets only, no torch);
``dit4dit_npu.serve.client`` re-exports its clients. This ``__init__`` imports nothing.
"""
