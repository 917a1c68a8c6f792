"""Model versions on disk: the folder layout (``version_folder``, no torch), the sealed
manifest, loading and saving a version (``model_version``), a version's classifier and
starting BERT (``version_module``).
"""
