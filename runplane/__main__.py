from runplane.commands.cli import main

raise SystemExit(main())
