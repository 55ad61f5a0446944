"""Interop with SkyRL, both ways. rlfleet inside SkyRL: `maze_env` runs the maze
in-process as a `skyrl_gym` environment; `remote_env` adapts a remote env service (any
task it serves). SkyRL inside rlfleet: `rlfleet.tasks.skyrl` serves any registered
skyrl-gym environment as an env task (`rlfleet env serve --skyrl-env ENV_ID[=DATASET]`).
Nothing is imported here so that `import rlfleet.skyrl` does not require skyrl-gym.
"""
