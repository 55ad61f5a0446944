"""Interop with SkyRL: `maze_env` runs the maze in-process as a `skyrl_gym` environment;
`remote_env` (separate) adapts the remote env service. Nothing is imported here so that
`import rlfleet.skyrl` does not require skyrl-gym.
"""
