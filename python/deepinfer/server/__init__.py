"""DeepInfer's OpenAI-compatible server: ``create_app(engine, ...)`` and the ``deepinfer serve`` command.

Importing this package is cheap; the web stack (FastAPI, uvicorn, prometheus-client) loads on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from deepinfer.server.app import create_app

        return create_app
    raise AttributeError(f"module 'deepinfer.server' has no attribute {name!r}")
