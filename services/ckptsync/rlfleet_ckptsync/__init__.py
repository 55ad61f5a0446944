"""The rlfleet ckptsync service."""
