from rffm.cli import main

raise SystemExit(main())
