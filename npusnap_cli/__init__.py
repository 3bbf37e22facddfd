"""npusnap: checkpoint/restore for Linux processes that hold accelerator state."""

__version__ = "0.1.0"
