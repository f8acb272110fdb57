from inferbus.shared.runtime import main

from .service import SanitizerService, SanitizerSettings

if __name__ == "__main__":
    main(SanitizerService, SanitizerSettings)
