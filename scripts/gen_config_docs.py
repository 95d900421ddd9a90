"""Write docs/configuration.md from the typed configuration (sluice/configref.py); --check: exit 1 if stale."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sluice.configref import render

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is stale: run python scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
