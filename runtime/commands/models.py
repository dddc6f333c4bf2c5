"""`lorabind models` (placeholder until its issue lands)."""


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    print("lorabind models: not implemented yet")
    return 2
