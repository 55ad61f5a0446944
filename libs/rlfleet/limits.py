"""Size bounds for everything that crosses the network.

The transport caps a whole message (MAX_MESSAGE_BYTES); the services check the fields
below so that one huge field is refused with INVALID_ARGUMENT / RESOURCE_EXHAUSTED and a
clear message instead of an out-of-memory or a slow death.
"""

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # one gRPC message, either direction
MAX_BATCH = 1024  # items in one batched env/reward call
MAX_ACTION_TEXT_BYTES = 8 * 1024  # one policy answer
MAX_TASK_NAME_BYTES = 64
MAX_EPISODE_ID_BYTES = 64
MAX_SEED = 2**53 - 1
MIN_GRID, MAX_GRID = 5, 63
MAX_TURNS = 1000
MAX_CELL_PX = 64
MAX_GROUP_SIZE = 64
MAX_NEW_TOKENS = 4096
MAX_IDEMPOTENCY_KEY_BYTES = 128
MAX_TRAJECTORY_TOKENS = 65536
MAX_RUN_NAME_BYTES = 64
MAX_REPLICAS = 1024
MAX_WAIT_S = 3600.0
