"""rlfleet: the shared library of the rlfleet services (RL post-training of VLMs as a fleet)."""

__version__ = "0.1.0"
