"""Serving: the tiny Kimi-shaped checkpoint, the vLLM server manager, the async HTTP client.

Nothing here imports Hydra or MLflow; vLLM itself is only ever a child process (or a server
someone else runs), never imported, so this package works beside any vLLM build.
"""
