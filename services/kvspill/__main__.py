"""`python -m inferbus.services.kvspill` (or `inferbus serve kvspill`): run it."""

from collections.abc import Sequence

from inferbus.shared import runtime

from .service import KvSpillService, KvSpillSettings


def main(argv: Sequence[str] | None = None) -> None:
    runtime.main(KvSpillService, KvSpillSettings, argv)


if __name__ == "__main__":
    main()
