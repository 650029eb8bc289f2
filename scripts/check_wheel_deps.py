"""Check that every requirement of the wheels carried to the GPU machine is carried too or in its image.

    python3 scripts/check_wheel_deps.py KINDS.md DIR [DIR ...]

``KINDS.md`` is the device notes' page whose section "Python packages already there" lists the image's
packages (the GPU device's notes); each ``DIR`` holds ``*.whl``. Requirements are read from each
wheel's METADATA (``Requires-Dist``) and their markers evaluated for CPython 3.12 on Linux x86_64, no
extras. Prints the unmet ones and exits 1, or prints ``ok`` and exits 0. Needs ``packaging``.
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement


def norm(name: str) -> str:
    """A distribution name in PEP 503 normal form."""
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages(kinds_md: str) -> set[str]:
    """The names after ``Packages:`` in the section ``## Python packages already there``."""
    section = kinds_md.split("## Python packages already there", 1)[1]
    listed = section.split("Packages:", 1)[1].split(".\n", 1)[0]
    return {norm(n.strip()) for n in listed.replace("\n", " ").split(",") if n.strip()}


def unmet(wheels: list[Path], image: set[str]) -> list[str]:
    """``"<wheel>: <requirement>"`` for each requirement neither carried nor in ``image``."""
    carried = {norm(w.name.split("-")[0]) for w in wheels}
    env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    out = []
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            lines = z.read(meta).decode().splitlines()
        for line in lines:
            if line.startswith("Requires-Dist:"):
                req = Requirement(line.split(":", 1)[1].strip())
                if (req.marker is None or req.marker.evaluate(env)) and norm(req.name) not in carried | image:
                    out.append(f"{w.name}: {req}")
    return out


def main() -> int:
    image = image_packages(Path(sys.argv[1]).read_text())
    wheels = sorted(w for d in sys.argv[2:] for w in Path(d).glob("*.whl"))
    missing = unmet(wheels, image)
    print("\n".join(missing) or f"ok: {len(wheels)} wheels, every requirement carried or in the image")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
