"""The package's version, in one module that imports nothing (``lightning_bpd.__version__`` re-exports it), so that
what records it (``save_heads``' ``heads.json``) need not import the package's front door."""

__version__ = "0.1.0"
