"""Every Redis key rlfleet uses, in one place."""

PREFIX = "rlfleet"


def replica(replica_id: str) -> str:
    return f"{PREFIX}:replica:{replica_id}"


def replica_pattern() -> str:
    return f"{PREFIX}:replica:*"


def latest(run: str) -> str:
    return f"{PREFIX}:run:{run}:latest"


def history(run: str) -> str:
    return f"{PREFIX}:run:{run}:history"


def acks(run: str, version: int) -> str:
    return f"{PREFIX}:run:{run}:acks:{version}"


def refusals(run: str, version: int) -> str:
    return f"{PREFIX}:run:{run}:refusals:{version}"


def events(run: str) -> str:
    return f"{PREFIX}:run:{run}:events"
