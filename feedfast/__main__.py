"""``python -m feedfast``."""

from feedfast.cli.main import main

raise SystemExit(main())
