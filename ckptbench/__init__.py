"""ckptbench: what will our checkpoints cost on this storage, and how often should we take them?"""

__version__ = "0.1.0"
