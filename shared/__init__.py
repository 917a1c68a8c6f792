"""The contract both sides import: mechanisms, payload schemas, edge bundle, accounting.

Importing this package is cheap on purpose (numpy at most, and only when a
submodule is used); it never imports torch or transformers.
"""

__version__ = "0.1.0"
