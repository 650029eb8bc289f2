"""The engine server (``diarist engine``, one per GPU) and the client workers reach it with.

``server`` is the FastAPI app that owns the engine, ``client`` the worker's side, ``protocol`` what both
send over the wire. The init imports nothing, so a worker importing the client never loads the server.
"""
