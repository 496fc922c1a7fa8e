"""Generated from proto/runplane/v1: do not edit; run `make proto`."""
