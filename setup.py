"""Package discovery: the folders the design names (contracts/, shared/, services/) sit at
the top of the repository and install under one import root, ``inferbus``. Every
subpackage with an ``__init__.py`` is found, so a new service folder is never left out
of the wheel (tests/unit/test_service_table.py builds one and checks)."""

from setuptools import find_packages, setup

ROOTS = {
    "inferbus": "inferbus",
    "inferbus.contracts": "contracts",
    "inferbus.shared": "shared",
    "inferbus.services": "services",
}


def packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]
    return sorted(set(found))


setup(package_dir=ROOTS, packages=packages())
