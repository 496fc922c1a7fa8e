"""The Kubernetes launcher: a Pod per run, the Pod watcher, and what a Pod's end does to its run."""
