"""The device side: tokenize, look up frozen embeddings, privatize, post only payloads.

Never imports torch or transformers.
"""
