"""The device side: tokenize, look up frozen embeddings, privatize, post only payloads.

Never imports torch or transformers. ``import edge_agent`` stays cheap: the
names below load on first use.
"""

from __future__ import annotations

__all__ = ["Privatizer"]


def __getattr__(name: str):
    if name == "Privatizer":
        # lazy: numpy: `import edge_agent` and the CLI's parser stay light
        from edge_agent.privatize.privatizer import Privatizer

        return Privatizer
    raise AttributeError(f"module 'edge_agent' has no attribute {name!r}")
