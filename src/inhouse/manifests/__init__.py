"""Model manifests: pin a model's files to sha256 hashes, lock them, verify them, refuse pickle;
and where the bundled default models lie on disk.

Imports no torch: the CLI, ``inhouse up`` and the server's start-up all check a manifest
before any engine loads.
"""
