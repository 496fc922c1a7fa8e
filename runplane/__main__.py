from runplane.cli import main

raise SystemExit(main())
