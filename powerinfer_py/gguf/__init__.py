"""GGUF and PowerInfer (PWRI) files: `open_gguf` reads (zero-copy tensor views), `write_gguf` writes atomically."""
from .reader import GGUFFile, open_gguf, read_metadata_only
from .writer import write_gguf

__all__ = ["GGUFFile", "open_gguf", "read_metadata_only", "write_gguf"]
