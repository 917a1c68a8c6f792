"""The torch networks: the BERT backbone, a classifier per payload kind, the exact nearest-
token search on a GPU.
"""
