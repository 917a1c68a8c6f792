"""The contract both sides import: mechanisms, payload schemas, edge bundle, accounting.

Importing this package is cheap on purpose (numpy and pydantic at most); it never imports
torch or transformers. It loads the mechanisms first: each mechanism's module registers its
cost, floor and guarantee (``shared.mechanisms.registry``) and imports the generic analysis
it reads (``ledger``, ``floor``, ``accounting``, which import no mechanism), so the tables
are full whichever module a caller imports first.
"""

__version__ = "0.1.0"

from shared import mechanisms  # noqa: E402, F401 (registers each mechanism's analysis)
