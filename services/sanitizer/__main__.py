"""`python -m inferbus.services.sanitizer` (or `inferbus serve sanitizer`): run one sanitizer."""

from collections.abc import Sequence

from inferbus.shared import runtime

from .service import SanitizerService, SanitizerSettings


def main(argv: Sequence[str] | None = None) -> None:
    runtime.main(SanitizerService, SanitizerSettings, argv)


if __name__ == "__main__":
    main()
