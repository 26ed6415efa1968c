"""`python -m deepserve`: the same as the `deepserve` command."""

from deepserve.cli import main

raise SystemExit(main())
