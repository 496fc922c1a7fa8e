"""The gRPC API: accounts, tokens, jobs and runs."""
