"""The contract both sides import: mechanisms, payload schemas, edge bundle, accounting.

Importing this package is cheap on purpose (numpy and pydantic at most); it never imports
torch or transformers. It loads the privacy analysis -- ``accounting``, ``floor``,
``ledger`` -- with the mechanisms, because those modules register each mechanism's
guarantee, floor and cost (``shared.mechanisms.registry``): a mechanism object answers
them whichever module created it, and no mechanism module imports the analysis.
"""

__version__ = "0.1.0"

from shared import accounting, floor, ledger  # noqa: E402, F401 (registers the analysis)
