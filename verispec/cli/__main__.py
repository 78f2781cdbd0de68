"""`python -m verispec.cli`: the `verispec` command."""

from verispec.cli.main import main

raise SystemExit(main())
