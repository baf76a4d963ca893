"""`python -m wingsmith`: the command line."""

from wingsmith.services.cli.main import main

raise SystemExit(main())
