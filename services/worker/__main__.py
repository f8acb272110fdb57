from inferbus.shared.runtime import main

from .service import WorkerService, WorkerSettings

if __name__ == "__main__":
    main(WorkerService, WorkerSettings)
