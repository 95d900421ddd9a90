"""`python -m sluice`: the `sluice` command."""

from sluice.main import main

raise SystemExit(main())
