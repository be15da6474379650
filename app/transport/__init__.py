"""How replicas move data between themselves besides Ray's own calls: stream channels (stream_channels.py). Plain
asyncio and sockets, on the lowest layer: it knows nothing of the API, the models or Ray."""
