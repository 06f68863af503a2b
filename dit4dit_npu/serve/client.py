"""The robot-side client lives in its own package, ``dit4dit_client`` (``client/`` in this
repository: numpy, msgpack and websockets only, no torch); this name stays importable."""

from dit4dit_client.websocket_client import Dit4DitClient, ServerError, WebsocketClientPolicy

__all__ = ["Dit4DitClient", "ServerError", "WebsocketClientPolicy"]
