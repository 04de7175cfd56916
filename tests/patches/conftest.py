"""Puts tests/patches on sys.path (pytest does so for a conftest's folder) for shared harnesses."""
